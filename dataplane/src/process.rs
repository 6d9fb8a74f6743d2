//! The per-packet pipeline.
//!
//! [`Pipeline::process`] takes one Ethernet frame and returns a [`Verdict`]; it never fails,
//! allocates, locks, makes a syscall or panics. Stages, in order:
//! 1. parse (Ethernet + one 802.1Q tag, IPv4/IPv6, L4) — [`crate::wire`];
//! 2. ICMP errors about tracked flows are translated and sent to the side that owns the flow;
//! 3. later fragments follow their first fragment — [`crate::frag`];
//! 4. frontend (VIP:port) lookup → conntrack → (new flow: affinity, scheduler, SNAT port) →
//!    DNAT / SNAT / DSR rewrite → next hop — [`crate::conntrack`], [`crate::sched`], [`crate::nat`];
//! 5. replies of NAT flows (reverse conntrack) are translated back so the client sees the VIP;
//! 6. a cluster IP on an unknown port, or a service with no endpoint, is rejected with ICMP
//!    port unreachable; everything else goes to the kernel untouched ([`Verdict::Pass`]).
//!
//! [`Pipeline::begin_batch`] runs once per RX batch: it adopts a new tables snapshot (resizing
//! per-service state, off the per-packet path), advances the clock and sweeps one conntrack
//! shard when due.

use std::sync::Arc;

use crate::addr::{Cidr, Family, V4, V6};
use crate::affinity::AffinityTable;
use crate::conntrack::{self, Conntrack, CtState, Flow, FlowKey, RevFlow, Timeouts, flow_flags};
use crate::counters::{DropReason, Event, WorkerCounters};
use crate::frag::{FragAction, FragEntry, FragKey, FragTable};
use crate::icmp;
use crate::maglev;
use crate::nat::{self, Packet};
use crate::sched::{FlowInfo, SchedState};
use crate::tables::{
    Backend, BackendRef, EmptyAction, ForwardingMode, FrontendEntry, FrontendKind, Hop, Tables, VipAddrKind, VipKey,
};
use crate::wire::{self, Frag, L3, Parsed, proto, tcp_flags};

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
    /// Interval between conntrack sweep steps (one shard each), in milliseconds.
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

/// Per-family state of one worker.
#[derive(Debug)]
pub struct FamState<A: Family> {
    /// Connection tracking.
    pub ct: Conntrack<A>,
    frag: FragTable<A>,
}

impl<A: Family> FamState<A> {
    fn new(c: &PipelineConfig) -> Self {
        Self { ct: Conntrack::new(c.conntrack_capacity), frag: FragTable::new(c.frag_capacity) }
    }
}

/// Selects the per-family state and family-specific table fields.
trait Fam: Family {
    fn state(w: &mut Families) -> &mut FamState<Self>;
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

/// State shared by both families on one worker.
#[derive(Debug)]
struct Common {
    cfg: PipelineConfig,
    sched: SchedState,
    counters: Arc<WorkerCounters>,
    now_s: u32,
    now_ms: u64,
    last_sweep_ms: u64,
    tokens: u32,
    tokens_s: u32,
    snat_cursor: u16,
    own_snat: (u16, u16),
    affinity: Arc<AffinityTable>,
}

impl Common {
    #[inline]
    fn admit_new_flow(&mut self) -> bool {
        let rate = self.cfg.new_flows_per_s;
        if rate == 0 {
            return true;
        }
        if self.tokens_s != self.now_s {
            self.tokens_s = self.now_s;
            self.tokens = rate;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
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

    #[inline]
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
}

/// One worker's pipeline: conntrack, fragment and affinity tables, scheduler state, counters.
#[derive(Debug)]
pub struct Pipeline {
    fam: Families,
    c: Common,
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
        Self {
            fam: Families { v4: FamState::new(&cfg), v6: FamState::new(&cfg) },
            c: Common {
                snat_cursor: cfg.own_snat_ports().0,
                own_snat: cfg.own_snat_ports(),
                cfg,
                sched: SchedState::new(seed),
                counters,
                now_s: 1,
                now_ms: 0,
                last_sweep_ms: 0,
                tokens: 0,
                tokens_s: 0,
                affinity,
            },
        }
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
    /// set the clock (`now_ms`, milliseconds of any monotonic clock) and sweep one conntrack
    /// shard per family when [`PipelineConfig::sweep_interval_ms`] has passed.
    pub fn begin_batch(&mut self, t: &Tables, now_ms: u64) {
        self.c.now_ms = now_ms;
        self.c.now_s = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX).saturating_add(1);
        self.c.sched.sync(t);
        if now_ms.saturating_sub(self.c.last_sweep_ms) >= self.c.cfg.sweep_interval_ms {
            self.c.last_sweep_ms = now_ms;
            let now = self.c.now_s;
            let (conns, counters) = (&mut self.c.sched.conns, &self.c.counters);
            let mut on = |r: conntrack::Removed| {
                conns.sub(r.backend, r.state.is_active());
                counters.event(if r.evicted { Event::ConntrackEvicted } else { Event::ConntrackExpired });
            };
            self.fam.v4.ct.sweep(now, &mut on);
            self.fam.v6.ct.sweep(now, &mut on);
        }
        self.c.counters.ct_entries.set((self.fam.v4.ct.len() + self.fam.v6.ct.len()) as u64);
    }

    /// Processes one frame that arrived on `in_port`. The frame may be rewritten in place,
    /// grown into the headroom (encapsulation) or replaced by a reply in place (ICMP error,
    /// TCP RST); the result is `pkt.buf[pkt.head..pkt.head + pkt.len]`.
    pub fn process(&mut self, t: &Tables, pkt: &mut Packet<'_>, in_port: u8) -> Verdict {
        let v = match wire::ethernet(pkt.frame()) {
            Err(r) => Verdict::Drop(r),
            Ok((L3::V4, at)) => run::<V4>(&mut self.fam, &mut self.c, t, pkt, at, in_port),
            Ok((L3::V6, at)) => run::<V6>(&mut self.fam, &mut self.c, t, pkt, at, in_port),
            Ok((L3::Other, _)) => Verdict::Pass,
        };
        let k = &self.c.counters;
        k.rx.inc();
        match v {
            Verdict::Tx { .. } => k.tx.inc(),
            Verdict::Pass => k.pass.inc(),
            Verdict::Drop(r) => k.count_drop(r),
            Verdict::Handoff { .. } => k.event(Event::HandedOff),
        }
        v
    }

    /// Processes a batch of frames that arrived on `in_port`, as [`Pipeline::process`] would
    /// one after the other: `verdicts[i]` is the verdict of `pkts[i]` (`verdicts` must be at
    /// least as long as `pkts`; extra frames get no verdict and are left alone).
    pub fn process_batch(&mut self, t: &Tables, pkts: &mut [Packet<'_>], in_port: u8, verdicts: &mut [Verdict]) {
        for (pkt, v) in pkts.iter_mut().zip(verdicts.iter_mut()) {
            *v = self.process(t, pkt, in_port);
        }
    }

    /// Lists tracked flows of both families (for `xlb conntrack`; allocates).
    pub fn dump_flows(&self) -> Vec<FlowDump> {
        let mut out = Vec::new();
        let now = self.c.now_s;
        fn push<A: Family>(ct: &Conntrack<A>, now: u32, out: &mut Vec<FlowDump>) {
            ct.for_each(|k, f| {
                out.push(FlowDump {
                    client: k.src.to_ip(),
                    cport: k.sport,
                    vip: k.dst.to_ip(),
                    vport: k.dport,
                    proto: k.proto,
                    backend: f.backend,
                    state: f.state,
                    expires_in_s: f.expires_s.saturating_sub(now),
                    snat_port: (f.flags & flow_flags::SNAT != 0).then_some(f.snat_port),
                });
            });
        }
        push(&self.fam.v4.ct, now, &mut out);
        push(&self.fam.v6.ct, now, &mut out);
        out
    }

    /// Active and inactive connection counts this worker holds for a backend.
    pub fn connections(&self, r: BackendRef) -> (u32, u32) {
        self.c.sched.conns.get(r)
    }
}

/// Is the packet addressed to something only xlb serves (a cluster IP, a LoadBalancer or
/// external IP, or the SNAT address)? Such packets are dropped when malformed or untracked;
/// anything else (node addresses included) is the kernel's.
fn is_ours<A: Fam>(t: &Tables, f: &[u8], l3: usize) -> bool {
    let Some(d) = f.get(l3 + A::DST_OFF..).and_then(A::from_slice) else { return false };
    t.vip_addrs.get(&d.to_mapped()).is_some_and(|k| *k >= VipAddrKind::Service) || A::snat(t) == Some(d)
}

fn run<A: Fam>(
    fam: &mut Families,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    at: usize,
    in_port: u8,
) -> Verdict {
    let parsed = if A::IS_V6 { wire::parse_v6(pkt.frame(), at) } else { wire::parse_v4(pkt.frame(), at) };
    let p = match parsed {
        Ok(p) => p,
        Err(r) => {
            return if is_ours::<A>(t, pkt.frame(), at + 2) { Verdict::Drop(r) } else { Verdict::Pass };
        }
    };
    let st = A::state(fam);
    let f = pkt.frame();
    let src: A = nat::src(f, &p);
    let dst: A = nat::dst(f, &p);
    if p.proto == A::ICMP && p.frag == Frag::None && A::is_icmp_error(p.icmp_type) {
        return icmp_error_in::<A>(st, c, t, pkt, &p);
    }
    if let Frag::Later { id } = p.frag {
        return later_fragment::<A>(st, c, t, pkt, &p, FragKey { src, dst, id, proto: p.proto });
    }
    let l4_ok = matches!(p.proto, proto::TCP | proto::UDP | proto::SCTP);
    let dm = dst.to_mapped();
    if l4_ok {
        if let Some(fe) = t.frontend(dm, p.proto, p.dport) {
            return forward::<A>(st, c, t, pkt, &p, fe, src, dst, in_port);
        }
        let rk = FlowKey { src, dst, sport: p.sport, dport: p.dport, proto: p.proto };
        if let Some(rev) = st.ct.get_rev(&rk) {
            return reply::<A>(st, c, t, pkt, &p, rk, rev);
        }
        if A::snat(t) == Some(dst) {
            return match c.cfg.snat_owner(p.dport) {
                Some(w) if w != c.cfg.worker_id => Verdict::Handoff { worker: w },
                _ => Verdict::Drop(DropReason::SnatUntracked),
            };
        }
        if c.cfg.workers > 1 && t.endpoints.contains(&VipKey { addr: src.to_mapped(), port: p.sport, proto: p.proto }) {
            // A reply from a backend that this worker has no flow for: RSS may have put it
            // on another queue than its forward packets. The next worker looks.
            return Verdict::Handoff { worker: (c.cfg.worker_id + 1) % c.cfg.workers };
        }
        if t.vip_addrs.get(&dm) == Some(&VipAddrKind::ClusterIp) {
            return reject::<A>(c, pkt, &p, in_port);
        }
    } else if p.proto != A::ICMP && t.vip_addrs.get(&dm).is_some_and(|k| *k >= VipAddrKind::Service) {
        return Verdict::Drop(DropReason::UnsupportedProtocol);
    }
    Verdict::Pass
}

fn reject<A: Fam>(c: &mut Common, pkt: &mut Packet<'_>, p: &Parsed, in_port: u8) -> Verdict {
    if icmp::port_unreachable::<A>(pkt, p) {
        c.counters.event(Event::RejectSent);
        Verdict::Tx { port: in_port }
    } else {
        Verdict::Drop(DropReason::NoRoom)
    }
}

#[inline]
fn initial_state(p: &Parsed) -> CtState {
    if p.proto != proto::TCP {
        return CtState::Datagram;
    }
    let base = if p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN {
        CtState::SynSent
    } else {
        // Mid-stream pickup (xlb restarted, or RSS moved the flow): Maglev keeps such flows
        // on their backend as long as the tables did not change.
        CtState::Established
    };
    conntrack::tcp_next(base, p.tcp_flags & !tcp_flags::ACK)
}

#[inline]
fn peer_mac(f: &[u8]) -> [u8; 6] {
    let mut m = [0u8; 6];
    if let Some(s) = f.get(6..12) {
        m.copy_from_slice(s);
    }
    m
}

#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
fn forward<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    fe: &FrontendEntry,
    src: A,
    dst: A,
    in_port: u8,
) -> Verdict {
    let Some(svc) = t.services.get(fe.service as usize) else { return Verdict::Pass };
    if !fe.source_ranges.is_empty() && !fe.source_ranges.iter().any(|r| r.contains_octets(src.octets())) {
        return Verdict::Drop(DropReason::SourceRangeDenied);
    }
    let key = FlowKey { src, dst, sport: p.sport, dport: p.dport, proto: p.proto };
    let now = c.now_s;
    let is_tcp = p.proto == proto::TCP;
    let (conns, counters) = (&mut c.sched.conns, &c.counters);
    let found = st.ct.get(&key, now, |r| {
        conns.sub(r.backend, r.state.is_active());
        counters.event(Event::ConntrackExpired);
    });
    if let Some(fl) = found {
        let syn_only = is_tcp && p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
        let reuse = syn_only && matches!(fl.state, CtState::FinWait | CtState::Closed);
        match t.backend(fl.backend) {
            Some(b) if !reuse => {
                let old = fl.state;
                let new = if is_tcp { conntrack::tcp_next(old, p.tcp_flags) } else { old };
                fl.state = new;
                fl.expires_s = now.saturating_add(c.cfg.timeouts.for_state(new));
                let flow = *fl;
                c.sched.conns.change(b.this, old.is_active(), new.is_active());
                c.count_packet(svc.id, b.this);
                return transmit_forward::<A>(st, c, t, pkt, p, svc.mode, b, &flow, src, dst);
            }
            Some(b) => {
                // A new connection on the tuple of a closing one (IPVS conn_reuse_mode).
                let flow = *fl;
                remove_flow::<A>(st, c, &key, &flow, Some(b));
                c.counters.event(Event::FlowReused);
            }
            None => {
                let flow = *fl;
                remove_flow::<A>(st, c, &key, &flow, None);
                if is_tcp {
                    // The backend left the tables: tell the client now, so it reconnects at
                    // once instead of retransmitting into a void (CT-03).
                    if icmp::tcp_reset_in_place::<A>(pkt, p) {
                        c.counters.event(Event::RstBackendGone);
                        return Verdict::Tx { port: in_port };
                    }
                    return Verdict::Drop(DropReason::NoRoom);
                }
                // UDP and SCTP flows are re-balanced at once: no stale-UDP black hole.
                c.counters.event(Event::ReselectBackendGone);
            }
        }
    }
    new_flow::<A>(st, c, t, pkt, p, fe, key, in_port)
}

fn remove_flow<A: Fam>(st: &mut FamState<A>, c: &mut Common, key: &FlowKey<A>, flow: &Flow, b: Option<&Backend>) {
    st.ct.remove(key);
    c.sched.conns.sub(flow.backend, flow.state.is_active());
    if let Some(b) = b
        && let Some(ba) = A::from_ip(b.addr)
    {
        st.ct.remove_rev(&reverse_key::<A>(key, flow, ba, b.port, A::UNSPECIFIED));
    }
}

/// The reply tuple of a NAT flow: backend → client (or → SNAT address and port).
#[inline]
fn reverse_key<A: Fam>(key: &FlowKey<A>, flow: &Flow, baddr: A, bport: u16, snat: A) -> FlowKey<A> {
    let (dst, dport) = if flow.flags & flow_flags::SNAT != 0 { (snat, flow.snat_port) } else { (key.src, key.sport) };
    FlowKey { src: baddr, dst, sport: bport, dport, proto: key.proto }
}

#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
fn new_flow<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    fe: &FrontendEntry,
    key: FlowKey<A>,
    in_port: u8,
) -> Verdict {
    let Some(svc) = t.services.get(fe.service as usize) else { return Verdict::Pass };
    if !c.admit_new_flow() {
        return Verdict::Drop(DropReason::NewFlowRateLimited);
    }
    let now = c.now_s;
    let mut chosen = None;
    if svc.affinity_timeout_s.is_some()
        && let Some(r) = c.affinity.get(&(svc.id, key.src.to_mapped()), now)
        // A sticky backend that left, or is draining, is not revived (AFF-08, TP-06).
        && t.backend(r).is_some_and(|b| b.eligible)
    {
        chosen = Some(r);
    }
    let info = FlowInfo { src: key.src.octets(), sport: key.sport, dst: key.dst.octets() };
    let chosen = chosen.or_else(|| c.sched.pick(fe.service as usize, svc, info));
    let Some(b) = chosen.and_then(|r| t.backend(r)) else {
        return match svc.when_empty {
            EmptyAction::Reject => reject::<A>(c, pkt, p, in_port),
            EmptyAction::Drop => Verdict::Drop(DropReason::NoEndpointsDrop),
        };
    };
    if let Some(to) = svc.affinity_timeout_s {
        c.affinity.put((svc.id, key.src.to_mapped()), b.this, now.saturating_add(to), now);
    }
    let Some(baddr) = A::from_ip(b.addr) else { return Verdict::Drop(DropReason::NoSourceAddress) };
    let state = initial_state(p);
    let mut flow = Flow {
        backend: b.this,
        expires_s: now.saturating_add(c.cfg.timeouts.for_state(state)),
        snat_port: 0,
        state,
        flags: 0,
        peer_mac: peer_mac(pkt.frame()),
        in_port,
    };
    let nat = svc.mode == ForwardingMode::Nat;
    // Hairpin (NAT-03): a backend reaching its own service must be masqueraded, or its reply
    // would go straight to itself and skip the un-DNAT. NAT-06: with cluster CIDRs known, a
    // ClusterIP flow from outside them is masqueraded too (kube-proxy's local-traffic rule).
    let off_cluster = fe.kind == FrontendKind::ClusterIp
        && !t.cluster_cidrs.is_empty()
        && !t.cluster_cidrs.iter().any(|r| r.contains_octets(key.src.octets()));
    let snat = nat && (fe.masquerade || baddr == key.src || off_cluster);
    let mut snat_addr = A::UNSPECIFIED;
    if !nat {
        flow.flags |= flow_flags::DSR;
    }
    if snat {
        let Some(sa) = A::snat(t) else { return Verdict::Drop(DropReason::NoSourceAddress) };
        snat_addr = sa;
        let mut port = None;
        for _ in 0..64 {
            let cand = c.next_snat_port();
            let rk = FlowKey { src: baddr, dst: sa, sport: b.port, dport: cand, proto: key.proto };
            if !st.ct.rev_exists(&rk) {
                port = Some(cand);
                break;
            }
        }
        let Some(port) = port else { return Verdict::Drop(DropReason::SnatPortsExhausted) };
        flow.flags |= flow_flags::SNAT;
        flow.snat_port = port;
    }
    let (conns, counters) = (&mut c.sched.conns, &c.counters);
    let inserted = st.ct.insert(key, flow, now, |r| {
        conns.sub(r.backend, r.state.is_active());
        counters.event(if r.evicted { Event::ConntrackEvicted } else { Event::ConntrackExpired });
    });
    if inserted.is_err() {
        return Verdict::Drop(DropReason::ConntrackFull);
    }
    if nat {
        let rk = reverse_key::<A>(&key, &flow, baddr, b.port, snat_addr);
        let rev =
            RevFlow { client: key.src, vip: key.dst, cport: key.sport, vport: key.dport, check_s: flow.expires_s };
        st.ct.insert_rev(rk, rev);
    }
    c.sched.conns.add(b.this, state.is_active());
    c.count_new_flow(svc.id, b.this);
    c.count_packet(svc.id, b.this);
    transmit_forward::<A>(st, c, t, pkt, p, svc.mode, b, &flow, key.src, key.dst)
}

/// Applies the forwarding mode to a client → service packet and picks the next hop.
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
fn transmit_forward<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    mode: ForwardingMode,
    b: &Backend,
    flow: &Flow,
    src: A,
    dst: A,
) -> Verdict {
    let Some(hop) = b.hop else { return Verdict::Drop(DropReason::NoNeighbour) };
    let Some(baddr) = A::from_ip(b.addr) else { return Verdict::Drop(DropReason::NoSourceAddress) };
    let action = match mode {
        ForwardingMode::Nat => {
            let new_src = if flow.flags & flow_flags::SNAT != 0 {
                match A::snat(t) {
                    Some(s) => s,
                    None => return Verdict::Drop(DropReason::NoSourceAddress),
                }
            } else {
                src
            };
            FragAction::Nat { src: new_src, dst: baddr }
        }
        ForwardingMode::DsrIpip => {
            let h = u32::try_from(maglev::source_hash(src.octets(), Some(p.sport)) & 0xffff_ffff).unwrap_or(0);
            let outer_src = match (A::dsr_prefix(t), A::snat(t)) {
                (Some(pre), _) => nat::outer_source::<A>(&pre, h),
                (None, Some(s)) => s,
                (None, None) => return Verdict::Drop(DropReason::NoSourceAddress),
            };
            FragAction::Encap { outer_src, outer_dst: baddr, flow_hash: h }
        }
        ForwardingMode::DsrL2 => FragAction::L2,
    };
    if let FragAction::Encap { .. } = action {
        let inner = p.end - p.l3;
        if inner + A::HEADER_LEN > usize::from(hop.mtu) && hop.mtu > 0 {
            let df = A::IS_V6 || pkt.frame().get(p.l3 + 6).is_some_and(|b| b & 0x40 != 0);
            let mtu = hop.mtu.saturating_sub(u16::try_from(A::HEADER_LEN).unwrap_or(0));
            if df && icmp::too_big::<A>(pkt, p, mtu) {
                c.counters.event(Event::TooBigSent);
                return Verdict::Tx { port: flow.in_port };
            }
            return Verdict::Drop(DropReason::TooBig);
        }
    }
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    if let Frag::First { id } = p.frag {
        let e = FragEntry { action, hop, backend: b.this, expires_s: c.now_s.saturating_add(c.cfg.frag_timeout_s) };
        if !st.frag.insert(FragKey { src, dst, id, proto: p.proto }, e, c.now_s) {
            // Its later fragments could not follow it, so sending it only wastes the path.
            return Verdict::Drop(DropReason::FragmentTableFull);
        }
    }
    apply(pkt, p, action, b.port, flow.snat_port, flow.flags & flow_flags::SNAT != 0, hop)
}

/// Applies an L3 action (and, for first packets with L4 headers, the port rewrites), then
/// the next hop's MACs.
#[inline]
fn apply<A: Fam>(
    pkt: &mut Packet<'_>,
    p: &Parsed,
    action: FragAction<A>,
    dport: u16,
    sport: u16,
    snat: bool,
    hop: Hop,
) -> Verdict {
    match action {
        FragAction::Nat { src, dst } => {
            let f = pkt.frame_mut();
            nat::set_dst::<A>(f, p, dst);
            nat::set_dport::<A>(f, p, dport);
            nat::set_src::<A>(f, p, src);
            if snat {
                nat::set_sport::<A>(f, p, sport);
            }
        }
        FragAction::Encap { outer_src, outer_dst, flow_hash } => {
            if !nat::encap::<A>(pkt, p, outer_src, outer_dst, flow_hash) {
                return Verdict::Drop(DropReason::NoRoom);
            }
        }
        FragAction::L2 => {}
    }
    nat::set_macs(pkt.frame_mut(), hop.src_mac, hop.dst_mac);
    Verdict::Tx { port: hop.port }
}

/// A reply of a NAT flow (backend → client or → SNAT address): restore the VIP as source and,
/// for SNAT flows, the client as destination; send it back where the client's packets came from.
fn reply<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    rk: FlowKey<A>,
    rev: RevFlow<A>,
) -> Verdict {
    let fk = rev.forward_key(p.proto);
    let now = c.now_s;
    let (conns, counters) = (&mut c.sched.conns, &c.counters);
    let Some(fl) = st.ct.get(&fk, now, |r| {
        conns.sub(r.backend, r.state.is_active());
        counters.event(Event::ConntrackExpired);
    }) else {
        st.ct.remove_rev(&rk);
        return if A::snat(t) == Some(rk.dst) { Verdict::Drop(DropReason::SnatUntracked) } else { Verdict::Pass };
    };
    let old = fl.state;
    if p.proto == proto::TCP {
        fl.state = conntrack::tcp_next(old, p.tcp_flags);
    }
    fl.expires_s = now.saturating_add(c.cfg.timeouts.for_state(fl.state));
    let flow = *fl;
    c.sched.conns.change(flow.backend, old.is_active(), flow.state.is_active());
    if let Some(b) = t.backend(flow.backend)
        && let Some(svc) = t.services.get(b.service as usize)
    {
        c.count_packet(svc.id, b.this);
    }
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    let snat = flow.flags & flow_flags::SNAT != 0;
    let new_dst = if snat { rev.client } else { rk.dst };
    let src_mac = t.ports.get(usize::from(flow.in_port)).map_or_else(|| dst_mac(pkt.frame()), |pt| pt.mac);
    let hop = Hop { port: flow.in_port, dst_mac: flow.peer_mac, src_mac, mtu: 0 };
    if let Frag::First { id } = p.frag {
        let e = FragEntry {
            action: FragAction::Nat { src: rev.vip, dst: new_dst },
            hop,
            backend: flow.backend,
            expires_s: now.saturating_add(c.cfg.frag_timeout_s),
        };
        if !st.frag.insert(FragKey { src: rk.src, dst: rk.dst, id, proto: p.proto }, e, now) {
            return Verdict::Drop(DropReason::FragmentTableFull);
        }
    }
    let f = pkt.frame_mut();
    nat::set_src::<A>(f, p, rev.vip);
    nat::set_sport::<A>(f, p, rev.vport);
    if snat {
        nat::set_dst::<A>(f, p, rev.client);
        nat::set_dport::<A>(f, p, rev.cport);
    }
    nat::set_macs(f, hop.src_mac, hop.dst_mac);
    Verdict::Tx { port: hop.port }
}

#[inline]
fn dst_mac(f: &[u8]) -> [u8; 6] {
    let mut m = [0u8; 6];
    if let Some(s) = f.get(0..6) {
        m.copy_from_slice(s);
    }
    m
}

fn later_fragment<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    k: FragKey<A>,
) -> Verdict {
    let Some(e) = st.frag.get(&k, c.now_s) else {
        return if is_ours::<A>(t, pkt.frame(), p.l3) {
            Verdict::Drop(DropReason::FragmentUntracked)
        } else {
            Verdict::Pass
        };
    };
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    c.counters.event(Event::FragmentForwarded);
    if let Some(b) = t.backend(e.backend)
        && let Some(svc) = t.services.get(b.service as usize)
    {
        c.count_packet(svc.id, b.this);
    }
    apply(pkt, p, e.action, 0, 0, false, e.hop)
}

/// An ICMP error addressed to a VIP or the SNAT address. Two cases:
/// - it quotes a packet xlb sent to a client (source VIP): a router on the client side
///   reports on the flow (e.g. PMTU). It goes to the backend that owns the flow, with outer
///   destination and quoted source rewritten to the backend (and the quoted destination to
///   the SNAT tuple for SNAT flows), or encapsulated for DSR;
/// - it quotes a packet xlb sent to a backend (reverse entry exists): it goes to the client,
///   with the quoted packet and the outer destination restored to the client's view.
fn icmp_error_in<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
) -> Verdict {
    let f = pkt.frame();
    let Ok(q) = icmp::quoted_view::<A>(f, p) else {
        return if is_ours::<A>(t, f, p.l3) { Verdict::Drop(DropReason::IcmpUntracked) } else { Verdict::Pass };
    };
    let qsrc: A = nat::src(f, &q);
    let qdst: A = nat::dst(f, &q);
    let now = c.now_s;
    // Case 1: quoted = VIP → client.
    let fk = FlowKey { src: qdst, dst: qsrc, sport: q.dport, dport: q.sport, proto: q.proto };
    if let Some(fl) = st.ct.get(&fk, now, |_| {}).copied() {
        let Some(b) = t.backend(fl.backend) else { return Verdict::Drop(DropReason::IcmpUntracked) };
        let Some(svc) = t.services.get(b.service as usize) else { return Verdict::Pass };
        let Some(hop) = b.hop else { return Verdict::Drop(DropReason::NoNeighbour) };
        let Some(baddr) = A::from_ip(b.addr) else { return Verdict::Drop(DropReason::NoSourceAddress) };
        if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        c.counters.event(Event::IcmpTranslated);
        let action = match svc.mode {
            ForwardingMode::Nat => {
                // Rewrites stay inside the IP packet, never in Ethernet padding.
                let fr = pkt.frame_mut();
                let fr = fr.get_mut(..p.end).unwrap_or(&mut []);
                nat::set_src::<A>(fr, &q, baddr);
                nat::set_sport::<A>(fr, &q, b.port);
                if fl.flags & flow_flags::SNAT != 0
                    && let Some(sa) = A::snat(t)
                {
                    nat::set_dst::<A>(fr, &q, sa);
                    nat::set_dport::<A>(fr, &q, fl.snat_port);
                }
                nat::set_dst::<A>(fr, p, baddr);
                icmp::refresh_icmp_checksum::<A>(fr, p.l3, p.l4, p.end);
                FragAction::L2
            }
            ForwardingMode::DsrIpip => {
                let outer_src = match (A::dsr_prefix(t), A::snat(t)) {
                    (Some(pre), _) => nat::outer_source::<A>(&pre, 0),
                    (None, Some(s)) => s,
                    (None, None) => return Verdict::Drop(DropReason::NoSourceAddress),
                };
                FragAction::Encap { outer_src, outer_dst: baddr, flow_hash: 0 }
            }
            ForwardingMode::DsrL2 => FragAction::L2,
        };
        return apply(pkt, p, action, 0, 0, false, hop);
    }
    // Case 2: quoted = xlb → backend (SNAT or DNAT flow).
    let rk = FlowKey { src: qdst, dst: qsrc, sport: q.dport, dport: q.sport, proto: q.proto };
    let Some(rev) = st.ct.get_rev(&rk) else { return Verdict::Drop(DropReason::IcmpUntracked) };
    let Some(fl) = st.ct.get(&rev.forward_key(q.proto), now, |_| {}).copied() else {
        return Verdict::Drop(DropReason::IcmpUntracked);
    };
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    let outer_src: A = nat::src(pkt.frame(), p);
    let fr = pkt.frame_mut();
    let fr = fr.get_mut(..p.end).unwrap_or(&mut []);
    nat::set_src::<A>(fr, &q, rev.client);
    nat::set_sport::<A>(fr, &q, rev.cport);
    nat::set_dst::<A>(fr, &q, rev.vip);
    nat::set_dport::<A>(fr, &q, rev.vport);
    if outer_src == qdst {
        // The backend itself reports (e.g. its port unreachable): it speaks for the VIP.
        nat::set_src::<A>(fr, p, rev.vip);
    }
    nat::set_dst::<A>(fr, p, rev.client);
    icmp::refresh_icmp_checksum::<A>(fr, p.l3, p.l4, p.end);
    let src_mac = t.ports.get(usize::from(fl.in_port)).map_or_else(|| dst_mac(fr), |pt| pt.mac);
    nat::set_macs(fr, src_mac, fl.peer_mac);
    c.counters.event(Event::IcmpTranslated);
    Verdict::Tx { port: fl.in_port }
}
