//! Stages 4 and 5 of the batch: the miss sub-batch's prefetches, and the slow path that
//! handles, one packet at a time in arrival order, everything the fast stage did not: new
//! flows, records made under older tables, connection reuse, replies whose flow expired,
//! ICMP errors, fragments, rejects, hand-offs, and frames the fast parser left.

use crate::conntrack::{self, Conntrack, CtState, Dir, FlowKey, Hit, Rec, flow_flags};
use crate::counters::{DropReason, Event};
use crate::csum;
use crate::frag::{FragAction, FragEntry, FragKey, Room};
use crate::icmp;
use crate::maglev;
use crate::nat::{self, Packet};
use crate::prefetch;
use crate::sched::FlowInfo;
use crate::tables::{
    Backend, EmptyAction, ForwardingMode, FrontendEntry, FrontendKind, Hop, KERNEL_PORT, Scheduler, Tables,
    VipAddrKind, VipKey, multipath_hash,
};
use crate::wire::{self, Frag, L3, Parsed, proto, tcp_flags};

use super::{BATCH, Common, Fam, FamState, Families, Lane, Lanes, Verdict};

/// Slots of a [`FrontendCache`]: 16 KiB of handles, four times the 1,000 frontends of the
/// pipeline benchmarks' tables.
const FE_CACHE_SLOTS: usize = 4096;

/// A worker's cache of frontend lookups (stage 4): handles into the tables' frontend map
/// ([`Tables::frontend_handle`]) by a hash of the key, each checked against the key in the
/// tables the batch runs on ([`Tables::frontend_by_handle`]) before use. A slot that names
/// another key, or a handle from an older snapshot that names nothing or another key now, is a
/// miss: the map is searched and the slot refilled. So the cache needs no invalidation and is
/// never wrong; it only spares the map's hash and probe (a new flow's frontend lookup cost 79
/// instructions through the map, a hit in the cache 39, callgrind, docs/benchmarks.md).
/// A key without a frontend is not cached.
pub(super) struct FrontendCache {
    slots: Box<[u32; FE_CACHE_SLOTS]>,
}

impl core::fmt::Debug for FrontendCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FrontendCache").field("slots", &FE_CACHE_SLOTS).finish_non_exhaustive()
    }
}

impl FrontendCache {
    /// An empty cache (every slot a handle that names nothing until filled).
    pub(super) fn new() -> Self {
        Self { slots: Box::new([u32::MAX; FE_CACHE_SLOTS]) }
    }

    /// The frontend of `(addr, proto, port)` in `t` (as [`Tables::frontend`]).
    #[inline(always)]
    fn get<'t>(&mut self, t: &'t Tables, addr: [u8; 16], proto: u8, port: u16) -> Option<&'t FrontendEntry> {
        let (hi, lo) = addr.split_at(8);
        let w = |b: &[u8]| b.first_chunk::<8>().map_or(0, |x| u64::from_be_bytes(*x));
        // An IPv4-mapped address's last word is `0xffff` and the address: the protocol and
        // port go over the `0xffff` (a one-to-one key for every IPv4 frontend).
        let key = w(hi).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ w(lo) ^ (u64::from(proto) << 56 | u64::from(port) << 40);
        let i = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize & (FE_CACHE_SLOTS - 1);
        let Some(slot) = self.slots.get_mut(i) else { return t.frontend(addr, proto, port) };
        if let Some(fe) = t.frontend_by_handle(*slot, addr, proto, port) {
            return Some(fe);
        }
        let h = t.frontend_handle(addr, proto, port)?;
        *slot = h;
        t.frontend_by_handle(h, addr, proto, port)
    }
}

/// What stage 4 found for the batch's missed packets, by packet index, for stage 5:
/// references into the tables the batch runs on, so that the slow path does not walk the
/// frontend map and the backend slots again (after the batch's inserts may have evicted the
/// lines those walks read).
pub(super) struct Misses<'t> {
    /// The frontend of packet `i`: `None` if stage 4 did not look it up, `Some(None)` if
    /// there is none.
    fe: [Option<Option<&'t FrontendEntry>>; BATCH],
    /// The backend a Maglev service without affinity picks for packet `i`.
    pick: [Option<&'t Backend>; BATCH],
    /// Packets (bit `i` = packet `i`) whose new flow is of the kind [`new_flow_direct`] takes.
    direct: u64,
    /// Packets whose new flow, to a random service, may be of that kind: [`new_flow_drawn`]
    /// draws the backend in stage 5, in arrival order, as the general route draws it.
    drawn: u64,
    /// The hash of packet `i`'s reply tuple, when it is in `direct`, or in `drawn` for the
    /// backend `guess` holds.
    reply_hash: [u64; BATCH],
    /// The backend stage 4 expects packet `i` of `drawn` to draw (a copy of the generator).
    guess: [Option<&'t Backend>; BATCH],
}

impl<'t> Misses<'t> {
    /// Nothing found yet.
    #[inline]
    pub(super) fn new() -> Self {
        Self {
            fe: [None; BATCH],
            pick: [None; BATCH],
            direct: 0,
            drawn: 0,
            reply_hash: [0; BATCH],
            guess: [None; BATCH],
        }
    }

    /// What stage 4 found for packet `i`.
    #[inline]
    pub(super) fn of(&self, i: usize) -> MissHint<'t> {
        MissHint { fe: self.fe.get(i).copied().flatten(), pick: self.pick.get(i).copied().flatten(), picked: false }
    }

    /// Whether packet `i`'s new flow is of the kind [`new_flow_direct`] takes.
    #[inline]
    pub(super) fn is_direct(&self, i: usize) -> bool {
        self.direct & (1 << (i & 63)) != 0
    }

    /// Whether packet `i`'s new flow is one [`new_flow_direct`] or [`new_flow_drawn`] takes.
    #[inline]
    pub(super) fn is_direct_or_drawn(&self, i: usize) -> bool {
        (self.direct | self.drawn) & (1 << (i & 63)) != 0
    }
}

/// What stage 4 found for one packet (see [`Misses`]).
#[derive(Copy, Clone, Debug)]
pub(super) struct MissHint<'t> {
    /// `None`: not looked up; `Some(None)`: no frontend.
    fe: Option<Option<&'t FrontendEntry>>,
    /// The Maglev pick, or with `picked` the random one.
    pick: Option<&'t Backend>,
    /// [`new_flow_drawn`] admitted the new flow (the new-flow rate limit) and drew its backend
    /// (`pick`; `None`: the service had none), then left it to the general route, which must do
    /// neither again.
    picked: bool,
}

impl MissHint<'_> {
    /// Stage 4 did not look at the packet.
    const NONE: Self = Self { fe: None, pick: None, picked: false };
}

/// What the earlier stages learnt of a fast-parsed packet that the slow path uses.
#[derive(Copy, Clone, Debug)]
struct Hint<'t, A> {
    key: FlowKey<A>,
    hash: u64,
    /// What the miss stage found.
    found: MissHint<'t>,
    /// The flow table had no entry for the key in stage 3.
    missed: bool,
}

/// Stage 4, for the lanes that missed: finds each one's frontend; for a Maglev service without
/// affinity computes the pick, prefetching the lookup-table slot, then the backend, then the
/// bucket where the new flow's reply entry will go; and prefetches the records the inserts will
/// take. The slow path then finds all of it in cache, and what was found in `m`.
pub(super) fn stage_misses<'t, A: Fam>(st: &mut FamState<A>, c: &Common, t: &'t Tables, slow: u64, m: &mut Misses<'t>) {
    let (lanes, ct, cache) = (&mut st.lanes, &st.ct, &mut st.fe_cache);
    // The table's arrays borrowed once for the stage's prefetches (each borrow of a mapped
    // region is a few checks).
    let view = ct.view();
    let mut misses = 0;
    // Lanes whose Maglev slot is to be read (bit = lane index).
    let mut maglev = 0u64;
    // The frontend of the previous new flow of the batch, by (address, protocol, port): new
    // flows come in runs to one frontend (a SYN flood, a flash crowd to one Service), and a
    // lookup in the frontend map hashes a 19-byte key (docs/benchmarks.md, "The live SYN
    // flood's budget, the frontend of the previous new flow ...").
    let mut last: Option<(A, u8, u16, Option<&'t FrontendEntry>)> = None;
    for (i, l) in lanes.l.get(..lanes.n).unwrap_or(&[]).iter().enumerate() {
        if !l.miss || slow & (1 << (l.pkt & 63)) == 0 {
            continue;
        }
        if let Some(id) = ct.next_alloc(misses) {
            view.prefetch_record(id);
        }
        misses += 1;

        let fe = match last {
            Some((dst, proto, dport, fe)) if dst == l.key.dst && proto == l.key.proto && dport == l.key.dport => fe,
            _ => {
                let fe = cache.get(t, l.key.dst.to_mapped(), l.key.proto, l.key.dport);
                last = Some((l.key.dst, l.key.proto, l.key.dport, fe));
                fe
            }
        };
        // `& 63` here and below: indices below BATCH = 64, so the bounds checks fold away.
        if let Some(x) = m.fe.get_mut(usize::from(l.pkt & 63)) {
            *x = Some(fe);
        }
        let Some(fe) = fe else { continue };
        let svc = &*fe.svc;
        if svc.scheduler == Scheduler::Random {
            // The random draw is stage 5's, in arrival order; what does not depend on the
            // backend is known now (the rest is checked after the draw).
            if c.direct && fe.plain_nat && !off_cluster::<A>(t, fe, l.key.src) {
                m.drawn |= 1 << (l.pkt & 63);
            }
            continue;
        }
        let (Scheduler::Maglev { port }, None, Some(mt)) = (svc.scheduler, svc.affinity_timeout_s, svc.maglev.as_ref())
        else {
            continue;
        };
        let slot = mt.prefetch(maglev::source_hash(l.key.src.octets(), port.then_some(l.key.sport)));
        if let Some(x) = lanes.maglev_slot.get_mut(i & 63) {
            *x = slot;
        }
        maglev |= 1 << (i & 63);
    }
    // Inserts that will evict: the victim's record was prefetched by the tag stage; now the
    // bucket of its other entry.
    if ct.len() + misses > ct.capacity() {
        let mut k = 0;
        for (l, &v) in lanes.l.get(..lanes.n).unwrap_or(&[]).iter().zip(lanes.victim.iter()) {
            if l.miss && slow & (1 << (l.pkt & 63)) != 0 {
                k += 1;
                if ct.len() + k > ct.capacity() {
                    if lanes.victims && v != conntrack::Probe::NONE {
                        view.prefetch_victim_other(v);
                    } else {
                        view.prefetch_victim(l.hash, c.now_s, 1);
                    }
                }
            }
        }
    }
    // New flows to random services: stage 5 draws their backends in arrival order; a copy of
    // the generator draws the same ones now (unless a new flow of the batch is dropped or found
    // before its draw: then the guesses after it are wrong and only waste their prefetch), so
    // that the insert finds the reply entry's bucket in cache.
    if m.drawn != 0 {
        let mut peek = c.sched.peek();
        for l in lanes.l.get(..lanes.n).unwrap_or(&[]) {
            let p = usize::from(l.pkt & 63);
            if m.drawn & (1 << p) == 0 {
                continue;
            }
            let Some(Some(Some(fe))) = m.fe.get(p) else { continue };
            let Some(b) = peek.draw_random(&fe.svc).and_then(|r| t.backend(r)) else { continue };
            if let Some(baddr) = A::from_ip(b.addr) {
                let (src, sport, proto) = (l.key.src, l.key.sport, l.key.proto);
                let rh = ct.hash(&FlowKey { src: baddr, dst: src, sport: b.port, dport: sport, proto });
                view.prefetch(rh);
                if let (Some(g), Some(x)) = (m.guess.get_mut(p), m.reply_hash.get_mut(p)) {
                    (*g, *x) = (Some(b), rh);
                }
            }
        }
    }
    if maglev == 0 {
        return;
    }
    let mut rest = maglev;
    while rest != 0 {
        let i = rest.trailing_zeros() as usize & 63;
        rest &= rest - 1;
        let (Some(l), Some(&slot)) = (lanes.l.get(i), lanes.maglev_slot.get(i)) else { continue };
        let p = usize::from(l.pkt & 63);
        let Some(Some(Some(fe))) = m.fe.get(p) else { continue };
        let svc = &*fe.svc;
        let Some(mt) = svc.maglev.as_ref() else { continue };
        let b = svc.eligible.get(mt.lookup_at(slot) as usize).and_then(|&r| t.backend(r));
        if let Some(b) = b {
            // Its first line and its last fields (an 80-byte `Backend` in a chunk spans two
            // lines).
            prefetch(b);
            prefetch(&b.node_local);
            c.prefetch_backend_state(b.this);
        }
        if let Some(x) = m.pick.get_mut(p) {
            *x = b;
        }
    }
    // The reply entries: for SNAT flows, guess the ports in the order the slow path will take
    // them (a wrong guess only costs the prefetch). A new flow without SNAT whose backend has
    // one next hop and a route, to a frontend without source ranges, is of the kind
    // `new_flow_direct` takes: its reply tuple's hash is kept for the insert.
    let mut snat_port = c.snat_cursor;
    let mut rest = maglev;
    while rest != 0 {
        let i = rest.trailing_zeros() as usize & 63;
        rest &= rest - 1;
        let Some(l) = lanes.l.get(i) else { continue };
        let p = usize::from(l.pkt & 63);
        let (Some(Some(Some(fe))), Some(Some(b))) = (m.fe.get(p), m.pick.get(p)) else { continue };
        let Some(baddr) = A::from_ip(b.addr) else { continue };
        // A plain NAT frontend (not masqueraded: `needs_snat` is false whatever the next hop;
        // no source ranges) and a backend with a route and one next hop.
        let direct =
            c.direct && fe.plain_nat && b.single_hop && baddr != l.key.src && !off_cluster::<A>(t, fe, l.key.src);
        if !direct && fe.svc.mode != ForwardingMode::Nat {
            continue;
        }
        let (dst, dport) = match A::snat(t) {
            Some(sa) if !direct && (fe.masquerade || baddr == l.key.src) => {
                snat_port = snat_port.wrapping_add(1);
                (sa, snat_port.wrapping_sub(1))
            }
            _ => (l.key.src, l.key.sport),
        };
        let rh = ct.hash(&FlowKey { src: baddr, dst, sport: b.port, dport, proto: l.key.proto });
        view.prefetch(rh);
        if direct {
            m.direct |= 1 << p;
            if let Some(x) = m.reply_hash.get_mut(p) {
                *x = rh;
            }
        }
    }
}

/// Whether a flow from `src` through ClusterIP frontend `fe` comes from outside the cluster
/// CIDRs, when they are known (NAT-06: such flows are masqueraded, kube-proxy's local-traffic
/// rule).
#[inline]
fn off_cluster<A: Fam>(t: &Tables, fe: &FrontendEntry, src: A) -> bool {
    fe.kind == FrontendKind::ClusterIp
        && !t.cluster_cidrs.is_empty()
        && !t.cluster_cidrs.iter().any(|x| x.contains_octets(src.octets()))
}

/// Whether a new flow from `src` through frontend `fe` to backend `b` (address `baddr`) of a
/// NAT service is masqueraded (SNAT). Hairpin (NAT-03): a backend reaching its own service
/// must be, or its reply would go straight to itself and skip the un-DNAT. NAT-06: a ClusterIP
/// flow from outside the cluster CIDRs is too ([`off_cluster`]). A backend reached through
/// the kernel (a pod on this node) never is: xlb's policy rule routes its replies back into
/// the punt device whatever their destination, while a reply to a SNAT address that is the
/// node's own would be delivered locally.
#[inline]
fn needs_snat<A: Fam>(t: &Tables, fe: &FrontendEntry, b: &Backend, baddr: A, src: A) -> bool {
    let via_kernel = b.hop.is_some_and(|h| h.port == KERNEL_PORT);
    !via_kernel && (fe.masquerade || baddr == src || off_cluster::<A>(t, fe, src))
}

/// A frame the fast parser did not take: parse it in full, then as [`run`].
pub(super) fn run_frame(fam: &mut Families, c: &mut Common, t: &Tables, pkt: &mut Packet<'_>, in_port: u8) -> Verdict {
    match wire::ethernet(pkt.frame()) {
        Err(r) => Verdict::Drop(r),
        Ok((L3::V4, at)) => run_full::<crate::addr::V4>(fam, c, t, pkt, at, in_port),
        Ok((L3::V6, at)) => run_full::<crate::addr::V6>(fam, c, t, pkt, at, in_port),
        Ok((L3::Other, _)) => Verdict::Pass,
    }
}

fn run_full<A: Fam>(
    fam: &mut Families,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    at: usize,
    in_port: u8,
) -> Verdict {
    let parsed = if A::IS_V6 { wire::parse_v6(pkt.frame(), at) } else { wire::parse_v4(pkt.frame(), at) };
    match parsed {
        Ok(p) => run::<A>(fam, c, t, pkt, &p, None, in_port),
        Err(r) => {
            if is_ours::<A>(t, pkt.frame(), at + 2) {
                Verdict::Drop(r)
            } else {
                Verdict::Pass
            }
        }
    }
}

/// A fast-parsed packet (lane `lane` of its family, packet `i` of the batch, `m` what stage 4
/// found) that the fast stage left.
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
#[inline(always)]
pub(super) fn run_lane<'t, A: Fam>(
    fam: &mut Families,
    c: &mut Common,
    t: &'t Tables,
    pkt: &mut Packet<'_>,
    lane: usize,
    m: &Misses<'t>,
    i: usize,
    in_port: u8,
) -> Verdict {
    let st = A::state(fam);
    let mut drawn = None;
    if m.is_direct_or_drawn(i) {
        if m.is_direct(i) {
            if let Some(v) = new_flow_direct::<A, _>(&st.lanes, &mut st.ct, c, pkt, lane, m, i, in_port) {
                return v;
            }
        } else {
            match new_flow_drawn::<A, _>(&st.lanes, &mut st.ct, c, t, pkt, lane, m, i, in_port) {
                Drawn::Done(v) => return v,
                Drawn::General => {}
                Drawn::Picked(b) => drawn = Some(b),
            }
        }
    }
    run_lane_general::<A>(fam, c, t, pkt, lane, m, i, in_port, drawn)
}

/// [`run_lane`] past the direct routes: the general route, with `drawn` what
/// [`new_flow_drawn`] drew for the packet (`Some`: the flow was admitted and its backend
/// drawn), if it did.
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
#[inline(always)]
pub(super) fn run_lane_general<'t, A: Fam>(
    fam: &mut Families,
    c: &mut Common,
    t: &'t Tables,
    pkt: &mut Packet<'_>,
    lane: usize,
    m: &Misses<'t>,
    i: usize,
    in_port: u8,
    drawn: Option<Option<&'t Backend>>,
) -> Verdict {
    let st = A::state(fam);
    let mut found = m.of(i);
    if let Some(b) = drawn {
        (found.pick, found.picked) = (b, true);
    }
    let Some(l) = st.lanes.as_slice().get(lane) else {
        return run_frame(fam, c, t, pkt, in_port);
    };
    let hint = Hint { key: l.key, hash: l.hash, found, missed: l.miss };
    // What the fast parser found, as the full parser's view (the same value, see
    // `wire::parse_fast`).
    let l3 = usize::from(l.l3);
    let p = Parsed {
        ethertype_at: l3 - 2,
        l3,
        l4: l3 + A::HEADER_LEN,
        end: l.end(),
        proto: l.key.proto,
        sport: l.key.sport,
        dport: l.key.dport,
        tcp_flags: l.tcp_flags,
        icmp_type: 0,
        frag: Frag::None,
        frag_hdr: 0,
    };
    // A fast-parsed packet is TCP or UDP and not fragmented: `run`'s ICMP and fragment
    // cases do not apply.
    run_l4::<A>(A::state(fam), c, t, pkt, &p, &hint, in_port)
}

/// Is the packet addressed to something only xlb serves (a cluster IP, a LoadBalancer or
/// external IP, or the SNAT address)? Such packets are dropped when malformed or untracked;
/// anything else (node addresses included) is the kernel's.
fn is_ours<A: Fam>(t: &Tables, f: &[u8], l3: usize) -> bool {
    let Some(d) = f.get(l3 + A::DST_OFF..).and_then(A::from_slice) else { return false };
    t.vip_addrs.get(&d.to_mapped()).is_some_and(|k| *k >= VipAddrKind::Service) || A::snat(t) == Some(d)
}

/// What a conntrack lookup of the slow path found.
enum Found {
    /// A live entry.
    Live(Hit),
    /// An entry whose flow had expired: removed and counted.
    Expired,
    /// Nothing.
    Miss,
}

fn lookup<A: Fam>(st: &mut FamState<A>, c: &mut Common, k: &FlowKey<A>, h: u64) -> Found {
    let Some(hit) = st.ct.find(k, h) else { return Found::Miss };
    let now = c.now_s;
    let Some(r) = st.ct.rec(hit.id) else { return Found::Miss };
    if r.expires_s >= now {
        return Found::Live(hit);
    }
    if let Some(r) = st.ct.remove(hit.id) {
        c.on_removed(r);
    }
    Found::Expired
}

fn run<A: Fam>(
    fam: &mut Families,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    hint: Option<Hint<'_, A>>,
    in_port: u8,
) -> Verdict {
    let st = A::state(fam);
    let (src, dst): (A, A) = match hint {
        Some(h) => (h.key.src, h.key.dst),
        None => (nat::src(pkt.frame(), p), nat::dst(pkt.frame(), p)),
    };
    if p.proto == A::ICMP && p.frag == Frag::None && A::is_icmp_error(p.icmp_type) {
        return icmp_error_in::<A>(st, c, t, pkt, p);
    }
    if let Frag::Later { id } = p.frag {
        let proto = frag_proto(pkt.frame(), p);
        return later_fragment::<A>(st, c, t, pkt, p, FragKey { src, dst, id, proto }, in_port);
    }
    if matches!(p.proto, proto::TCP | proto::UDP | proto::SCTP) {
        let hint = match hint {
            Some(h) => h,
            None => {
                let key = FlowKey { src, dst, sport: p.sport, dport: p.dport, proto: p.proto };
                Hint { key, hash: st.ct.hash(&key), found: MissHint::NONE, missed: false }
            }
        };
        return run_l4::<A>(st, c, t, pkt, p, &hint, in_port);
    }
    if p.proto != A::ICMP && t.vip_addrs.get(&dst.to_mapped()).is_some_and(|k| *k >= VipAddrKind::Service) {
        return Verdict::Drop(DropReason::UnsupportedProtocol);
    }
    Verdict::Pass
}

/// [`run`] for a TCP, UDP or SCTP packet that is not a later fragment: to a frontend, a reply
/// of a tracked flow, or neither.
fn run_l4<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    hint: &Hint<'_, A>,
    in_port: u8,
) -> Verdict {
    let (key, h) = (hint.key, hint.hash);
    let (src, dst) = (key.src, key.dst);
    let fe = match hint.found.fe {
        None => t.frontend(dst.to_mapped(), p.proto, p.dport),
        Some(fe) => fe,
    };
    if let Some(fe) = fe {
        return forward::<A>(st, c, t, pkt, p, fe, hint, in_port);
    }
    match lookup(st, c, &key, h) {
        Found::Live(hit) if hit.dir == Dir::Reply => {
            if !answers_another_connection(st, p, &hit) {
                return reply::<A>(st, c, t, pkt, p, hit, in_port);
            }
            // A backend's SYN on the reply tuple of a closing flow answers a SYN that did not
            // come through xlb (that SYN would have replaced the flow, IPVS conn_reuse_mode):
            // a client's direct connection to the backend from the port of its earlier
            // connection through a VIP, whose replies the kernel routes into xlb. Linux
            // conntrack would have given the new connection another source port (the null
            // binding's clash, nf_nat_core.c); xlb cannot, so it forgets the closing flow, and
            // the packet and the rest of that connection are the kernel's.
            remove_flow(st, c, hit.id);
            c.counters.event(Event::ReplyTupleReused);
        }
        Found::Expired => {
            return if A::snat(t) == Some(dst) { Verdict::Drop(DropReason::SnatUntracked) } else { Verdict::Pass };
        }
        // A forward entry of a flow whose frontend left the tables: not forwarded.
        Found::Live(_) | Found::Miss => {}
    }
    if A::snat(t) == Some(dst) {
        return match c.cfg.snat_owner(p.dport) {
            Some(w) if w != c.cfg.worker_id => Verdict::Handoff { worker: w },
            _ => Verdict::Drop(DropReason::SnatUntracked),
        };
    }
    if let Some(worker) = c.cfg.next_worker()
        && t.endpoints.contains(&VipKey { addr: src.to_mapped(), port: p.sport, proto: p.proto })
    {
        // A reply from a backend that this worker has no flow for: RSS may have put it
        // on another queue than its forward packets. The next worker looks.
        return Verdict::Handoff { worker };
    }
    if t.vip_addrs.get(&dst.to_mapped()) == Some(&VipAddrKind::ClusterIp) {
        return reject::<A>(c, pkt, p, in_port);
    }
    Verdict::Pass
}

/// Whether a packet that matched flow `hit`'s reply tuple is a TCP SYN (a SYN-ACK from the
/// backend) while the flow is closing ([`CtState::FinWait`], [`CtState::Closed`]): the flow's
/// own handshake is over, and a new SYN through a frontend would have replaced it.
fn answers_another_connection<A: Fam>(st: &FamState<A>, p: &Parsed, hit: &Hit) -> bool {
    p.proto == proto::TCP
        && p.tcp_flags & tcp_flags::SYN != 0
        && st.ct.rec(hit.id).is_some_and(|r| matches!(r.ct_state(), CtState::FinWait | CtState::Closed))
}

fn reject<A: Fam>(c: &mut Common, pkt: &mut Packet<'_>, p: &Parsed, in_port: u8) -> Verdict {
    if !icmp::may_answer::<A>(pkt.frame(), p) {
        return Verdict::Drop(DropReason::IcmpErrorForbidden);
    }
    if !c.admit_icmp_error() {
        return Verdict::Drop(DropReason::IcmpRateLimited);
    }
    if icmp::port_unreachable::<A>(pkt, p) {
        c.counters.event(Event::RejectSent);
        Verdict::Tx { port: in_port }
    } else {
        Verdict::Drop(DropReason::NoRoom)
    }
}

#[inline]
fn initial_state(p: &Parsed) -> CtState {
    initial_state_of(p.proto, p.tcp_flags)
}

/// The state of a new flow of protocol `ip_proto` whose first packet has TCP flags `flags`:
/// [`initial_tcp_state`], read from [`INITIAL_TCP`].
#[inline]
fn initial_state_of(ip_proto: u8, flags: u8) -> CtState {
    if ip_proto != proto::TCP {
        return CtState::Datagram;
    }
    INITIAL_TCP.get(usize::from(flags & TCP_STATE_FLAGS)).copied().unwrap_or(CtState::Closed)
}

/// The TCP flags a new flow's state depends on: FIN, SYN, RST and ACK.
const TCP_STATE_FLAGS: u8 = tcp_flags::FIN | tcp_flags::SYN | tcp_flags::RST | tcp_flags::ACK;

/// [`initial_tcp_state`] of every value of the [`TCP_STATE_FLAGS`] bits, computed at compile
/// time: a new flow reads its state here (its branches through [`conntrack::tcp_next`] cost
/// about 16 instructions per new flow, callgrind, docs/benchmarks.md).
#[expect(clippy::indexing_slicing, clippy::cast_possible_truncation, reason = "compile-time: i < 32")]
const INITIAL_TCP: [CtState; 32] = {
    let mut t = [CtState::Closed; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = initial_tcp_state(i as u8);
        i += 1;
    }
    t
};

/// The state of a new TCP flow whose first packet has flags `flags`.
const fn initial_tcp_state(flags: u8) -> CtState {
    let base = if flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN {
        CtState::SynSent
    } else {
        // Mid-stream pickup (xlb restarted without a hand-over, or RSS moved the flow;
        // counted `flow_picked_up`): Maglev (`mh`) and `sh` hash the flow with a fixed
        // function, so such a flow reaches its former backend as long as the tables did not
        // change; the other schedulers choose afresh.
        CtState::Established
    };
    conntrack::tcp_next(base, flags & !tcp_flags::ACK)
}

/// A packet to a frontend.
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
fn forward<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    fe: &FrontendEntry,
    hint: &Hint<'_, A>,
    in_port: u8,
) -> Verdict {
    let (key, h) = (hint.key, hint.hash);
    if !fe.source_ranges.is_empty() && !fe.source_ranges.iter().any(|r| r.contains_octets(key.src.octets())) {
        return Verdict::Drop(DropReason::SourceRangeDenied);
    }
    let is_tcp = p.proto == proto::TCP;
    // A packet that missed in stage 3 still misses unless an entry with the same hash bit was
    // placed since (find-or-insert without a second probe).
    let found = if hint.missed && !st.ct.may_have_placed(h) { Found::Miss } else { lookup(st, c, &key, h) };
    match found {
        Found::Live(hit) if hit.dir == Dir::Forward => {
            let Some(mut r) = st.ct.rec(hit.id).copied() else { return Verdict::Drop(DropReason::ConntrackFull) };
            let old = r.ct_state();
            let syn_only = is_tcp && p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
            let reuse = syn_only && matches!(old, CtState::FinWait | CtState::Closed);
            let mut backend = t.backend(r.backend);
            // The flow's slot was freed, but its backend may have stayed in the frontend's
            // service under another slot (a Service's external frontends merging into or
            // splitting from its internal spec): the flow keeps its backend.
            if backend.is_none()
                && !reuse
                && let Some(b) = t.member_at(fe.service, r.backend_addr.to_ip(), r.bport)
            {
                c.sched.conns.sub(r.backend, old.is_active());
                c.sched.conns.add(b.this, old.is_active());
                r.backend = b.this;
                if let Some(x) = st.ct.rec_mut(hit.id) {
                    x.backend = b.this;
                }
                c.counters.event(Event::FlowRebound);
                backend = Some(b);
            }
            match (backend, reuse) {
                (Some(b), false) => return established::<A>(st, c, t, pkt, p, &hit, r, b, in_port),
                (_, true) => {
                    // A new connection on the tuple of a closing one (IPVS conn_reuse_mode),
                    // whether or not the closing one's backend is still in the tables.
                    remove_flow(st, c, hit.id);
                    c.counters.event(Event::FlowReused);
                }
                (None, false) => {
                    remove_flow(st, c, hit.id);
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
        Found::Live(hit) => {
            // This client tuple is the reply tuple of another flow (only with overlapping
            // addresses): the frontend wins, as it always did; that flow loses its reply entry.
            st.ct.release_reply(hit.id);
        }
        Found::Expired | Found::Miss => {}
    }
    // No flow from a source no host has (spoofed): a router drops it (RFC 1812 §5.3.7), and
    // its backend would answer a group or itself.
    if key.src.is_martian_source() {
        return Verdict::Drop(DropReason::MartianSource);
    }
    new_flow::<A>(st, c, t, pkt, p, fe, key, h, hint.found, in_port)
}

/// The drop reason of a new flow's failed insert.
fn insert_failed(e: conntrack::InsertError) -> DropReason {
    match e {
        conntrack::InsertError::Full => DropReason::ConntrackFull,
        conntrack::InsertError::ReplyTupleInUse => DropReason::ReplyTupleInUse,
    }
}

fn remove_flow<A: Fam>(st: &mut FamState<A>, c: &mut Common, id: conntrack::RecId) {
    if let Some(r) = st.ct.remove(id) {
        c.sched.conns.sub(r.backend, r.state.is_active());
    }
}

/// A packet of a tracked flow whose record the fast stage could not use, arrived on
/// `in_port`: state, expiry and counters as usual, the record refreshed from the tables (next
/// hop, service) and stamped with their generation, then the rewrite.
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
fn established<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    hit: &Hit,
    mut r: Rec<A>,
    b: &Backend,
    in_port: u8,
) -> Verdict {
    let old = r.ct_state();
    let new = if p.proto == proto::TCP { conntrack::tcp_next(old, p.tcp_flags) } else { old };
    let now = c.now_s;
    // A backend in the tables names its service's id.
    let svc_id = b.service;
    r.state = new as u8;
    r.expires_s = now.saturating_add(c.timeout(new));
    c.sched.conns.change(b.this, old.is_active(), new.is_active());
    c.count_packet(svc_id, b.this);
    refresh::<A>(&mut r, c, t, b, svc_id);
    if let Some(x) = st.ct.rec_mut(hit.id) {
        write_refreshed(x, &r, true);
    }
    if new.is_evictable() != old.is_evictable() {
        st.ct.set_evictable(hit, new.is_evictable());
    }
    transmit_forward::<A>(st, c, t, pkt, p, &r, b, in_port)
}

/// Recomputes the parts of a record that depend on the tables (next hop, service id, the outer
/// source of an encapsulated flow, [`flow_flags::MTU_CHECK`]) and stamps it with their
/// generation; a backend without a next hop leaves the record unstamped (its packets are
/// dropped until the neighbour resolves).
fn refresh<A: Fam>(r: &mut Rec<A>, c: &Common, t: &Tables, b: &Backend, svc_id: u32) {
    r.svc = svc_id;
    if r.flags & flow_flags::ENCAP != 0
        && let Some(outer) = outer_source::<A>(t, flow_hash_of(r))
    {
        r.reply_dst = outer;
    }
    match flow_hop(t, b, r) {
        Some(hop) => {
            r.out_port = hop.port;
            r.hop_mac = hop.dst_mac;
            r.generation = c.generation;
            let check = r.flags & flow_flags::ENCAP == 0 && c.mtu_differs(r.in_port, hop.port);
            r.flags = r.flags & !flow_flags::MTU_CHECK | if check { flow_flags::MTU_CHECK } else { 0 };
        }
        None => r.generation = 0,
    }
}

/// Writes what [`refresh`] recomputed from the copy `r` back into the record `x` in the table
/// (the reply destination too when `reply_dst`), keeping `x`'s other flags (the batch's
/// [`flow_flags::DEFERRED`] among them).
fn write_refreshed<A: Fam>(x: &mut Rec<A>, r: &Rec<A>, reply_dst: bool) {
    (x.state, x.expires_s, x.svc, x.generation, x.out_port, x.hop_mac) =
        (r.state, r.expires_s, r.svc, r.generation, r.out_port, r.hop_mac);
    if reply_dst {
        x.reply_dst = r.reply_dst;
    }
    x.flags = x.flags & !flow_flags::MTU_CHECK | r.flags & flow_flags::MTU_CHECK;
}

/// The next hop of flow `r` to backend `b`: its path of a multipath route
/// ([`Backend::path`], hashed over the flow as it leaves: source after NAT, backend, ports),
/// else the backend's hop.
#[inline]
fn flow_hop<A: Fam>(t: &Tables, b: &Backend, r: &Rec<A>) -> Option<Hop> {
    if b.paths.is_empty() {
        return b.hop;
    }
    let (src, dst) = (r.reply_dst, r.backend_addr);
    let h = multipath_hash(t.multipath_l4, src.octets(), dst.octets(), r.proto, r.reply_dport, r.bport);
    b.path(h)
}

/// The flow hash an encapsulated flow keeps in its IPv4 header delta fields (see
/// [`set_rewrite`]).
pub(super) fn flow_hash_of<A: Fam>(r: &Rec<A>) -> u32 {
    u32::from(r.ip_delta_fwd) << 16 | u32::from(r.ip_delta_rev)
}

/// The outer source address of IPIP / IP6IP6 DSR for a flow hash: from the DSR source prefix,
/// else the SNAT address.
fn outer_source<A: Fam>(t: &Tables, h: u32) -> Option<A> {
    match (A::dsr_prefix(t), A::snat(t)) {
        (Some(pre), _) => Some(nat::outer_source::<A>(&pre, h)),
        (None, Some(s)) => Some(s),
        (None, None) => None,
    }
}

/// Fills the precomputed rewrite of a new record: the RFC 1624 deltas of the NAT rewrite
/// (forward: client → `reply_dst`, VIP → backend, ports likewise; replies the reverse), with
/// the TTL decrement folded into the IPv4 header's, stored in wire order ([`csum::wire`]),
/// or, for an encapsulated DSR flow, its flow hash (the IPv6 flow label, RFC 6438) in the two
/// IPv4 header delta fields, which encapsulation does not use.
fn set_rewrite<A: Fam>(r: &mut Rec<A>, flow_hash: u32) {
    if r.flags & flow_flags::ENCAP != 0 {
        r.ip_delta_fwd = (flow_hash >> 16) as u16;
        r.ip_delta_rev = (flow_hash & 0xffff) as u16;
        r.l4_delta = 0;
        return;
    }
    if r.flags & flow_flags::DSR != 0 {
        (r.ip_delta_fwd, r.ip_delta_rev, r.l4_delta) = (0, 0, 0);
        return;
    }
    let (client, reply_dst, vip, backend) = (r.client, r.reply_dst, r.vip, r.backend_addr);
    let mut acc = csum::delta_add(0, client.octets(), reply_dst.octets());
    acc = csum::delta_add(acc, vip.octets(), backend.octets());
    let addr = csum::delta(acc);
    r.ip_delta_fwd = csum::wire(csum::add_deltas(addr, csum::TTL_DEC));
    r.ip_delta_rev = csum::wire(csum::add_deltas(csum::negate(addr), csum::TTL_DEC));
    acc = csum::delta_add(acc, &r.cport.to_be_bytes(), &r.reply_dport.to_be_bytes());
    acc = csum::delta_add(acc, &r.vport.to_be_bytes(), &r.bport.to_be_bytes());
    r.l4_delta = csum::wire(csum::delta(acc));
}

/// The record of a new flow with key `key` in state `state`, of service `svc_id`, to backend
/// `b` at `baddr`, whose first packet came in on `in_port` from MAC `peer_mac`: tuples as for
/// DNAT (the reply goes back to the client), expiry `now + timeout(state)` (the batch's table
/// of them). Flags, rewrite and next hop are the caller's.
#[expect(clippy::too_many_arguments, reason = "the fields of a new record, from the stage inputs")]
#[inline(always)]
fn new_record<A: Fam>(
    c: &Common,
    key: &FlowKey<A>,
    state: CtState,
    svc_id: u32,
    b: &Backend,
    baddr: A,
    in_port: u8,
    peer_mac: [u8; 6],
) -> Rec<A> {
    let mut r = Rec::<A>::zeroed_record();
    r.backend = b.this;
    r.expires_s = c.expiry(state);
    r.svc = svc_id;
    (r.client, r.vip, r.cport, r.vport, r.proto) = (key.src, key.dst, key.sport, key.dport, key.proto);
    (r.reply_dst, r.reply_dport) = (key.src, key.sport);
    (r.backend_addr, r.bport) = (baddr, b.port);
    r.state = state as u8;
    r.in_port = in_port;
    r.peer_mac = peer_mac;
    r
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
    h: u64,
    found: MissHint<'_>,
    in_port: u8,
) -> Verdict {
    let svc = &*fe.svc;
    if !found.picked && !c.admit_new_flow() {
        return Verdict::Drop(DropReason::NewFlowRateLimited);
    }
    let now = c.now_s;
    let mut chosen = None;
    if let Some(to) = svc.affinity_timeout_s
        && let Some(r) = c.affinity.get(&(svc.id, key.src.to_mapped()), now, to)
        // A sticky backend that left, or is draining, is not revived (AFF-08, TP-06).
        && t.backend(r).is_some_and(|b| b.eligible)
    {
        chosen = Some(r);
    }
    let chosen = match (chosen, found.pick) {
        (Some(r), _) => t.backend(r),
        (None, Some(b)) if matches!(svc.scheduler, Scheduler::Maglev { .. }) => Some(b),
        (None, b) if found.picked => b,
        _ => {
            let info = FlowInfo { src: key.src.octets(), sport: key.sport, dst: key.dst.octets() };
            c.sched.pick(fe.service as usize, svc, info).and_then(|r| t.backend(r))
        }
    };
    let Some(b) = chosen else {
        return match svc.when_empty {
            EmptyAction::Reject => reject::<A>(c, pkt, p, in_port),
            EmptyAction::Drop => Verdict::Drop(DropReason::NoEndpointsDrop),
        };
    };
    if b.no_route {
        // Unreachable now; the flow is not tracked, so the next packet is scheduled again
        // (and reaches the backend once a route to it appears).
        return Verdict::Drop(DropReason::NoRoute);
    }
    if let Some(to) = svc.affinity_timeout_s {
        c.affinity.put((svc.id, key.src.to_mapped()), b.this, now.saturating_add(to), to, now);
    }
    let Some(baddr) = A::from_ip(b.addr) else { return Verdict::Drop(DropReason::NoSourceAddress) };
    let state = initial_state(p);
    let mut r = new_record::<A>(c, &key, state, svc.id, b, baddr, in_port, wire::emit::src_mac(pkt.frame()));
    let mut flow_hash = 0;
    let snat = svc.mode == ForwardingMode::Nat && needs_snat::<A>(t, fe, b, baddr, key.src);
    match svc.mode {
        ForwardingMode::Nat => {}
        ForwardingMode::DsrIpip => {
            r.flags |= flow_flags::DSR | flow_flags::ENCAP;
            flow_hash =
                u32::try_from(maglev::source_hash(key.src.octets(), Some(key.sport)) & 0xffff_ffff).unwrap_or(0);
            let Some(outer) = outer_source::<A>(t, flow_hash) else {
                return Verdict::Drop(DropReason::NoSourceAddress);
            };
            r.reply_dst = outer;
        }
        ForwardingMode::DsrL2 => r.flags |= flow_flags::DSR,
    }
    if snat {
        let Some(sa) = A::snat(t) else { return Verdict::Drop(DropReason::NoSourceAddress) };
        let mut port = None;
        for _ in 0..64 {
            let cand = c.next_snat_port();
            let rk = FlowKey { src: baddr, dst: sa, sport: b.port, dport: cand, proto: key.proto };
            if st.ct.is_free(&rk, st.ct.hash(&rk)) {
                port = Some(cand);
                break;
            }
        }
        let Some(port) = port else { return Verdict::Drop(DropReason::SnatPortsExhausted) };
        r.flags |= flow_flags::SNAT;
        (r.reply_dst, r.reply_dport) = (sa, port);
    }
    set_rewrite::<A>(&mut r, flow_hash);
    refresh::<A>(&mut r, c, t, b, svc.id);
    if let Err(e) = st.ct.insert(r, h, now, |x| c.on_removed(x)) {
        return Verdict::Drop(insert_failed(e));
    }
    c.sched.conns.add(b.this, state.is_active());
    c.count_new_flow(svc.id, b.this);
    if p.proto == proto::TCP && p.tcp_flags & tcp_flags::SYN == 0 {
        c.counters.event(Event::FlowPickedUp);
    }
    c.count_packet(svc.id, b.this);
    transmit_forward::<A>(st, c, t, pkt, p, &r, b, in_port)
}

/// A new flow of the most common kind, which stage 4 found (`Misses::direct`; packet `i` of
/// the batch, lane `lane`): a fast-parsed packet to a Maglev service without affinity in NAT
/// mode, from a frontend without source ranges, to a backend with a route and one next hop,
/// without SNAT. What [`forward`] and [`new_flow`] do for it, without the cases that do not
/// apply: the record, built with its rewrite, is inserted under the reply hash stage 4
/// computed (`Misses::reply_hash`), and the packet is rewritten from it ([`insert_direct`]).
/// `None`, nothing done, when the general path must look (the flow table had an entry for the
/// key in stage 3 or has one now, or the backend is not of the packet's family). Always
/// inlined, as [`new_flow_drawn`] is: with both out of line, a new flow paid 29 to 35 more
/// instructions on either direct route, while the general route pays 29 more with them
/// inlined beside it (callgrind, docs/benchmarks.md, "Fewer calls on a SYN's way").
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
#[inline(always)]
fn new_flow_direct<A: Fam, T: DirectTable<A>>(
    lanes: &Lanes<A>,
    ct: &mut T,
    c: &mut Common,
    pkt: &mut Packet<'_>,
    lane: usize,
    m: &Misses<'_>,
    i: usize,
    in_port: u8,
) -> Option<Verdict> {
    let (Some(Some(Some(fe))), Some(Some(b)), Some(&reply_hash)) = (m.fe.get(i), m.pick.get(i), m.reply_hash.get(i))
    else {
        return None;
    };
    let l = lanes.as_slice().get(lane)?;
    if !still_new(ct, l) {
        return None;
    }
    let (Some(hop), Some(baddr)) = (b.hop, A::from_ip(b.addr)) else { return None };
    // A martian source: the general route drops it (`forward`).
    if l.key.src.is_martian_source() {
        return None;
    }
    if !c.admit_new_flow() {
        return Some(Verdict::Drop(DropReason::NewFlowRateLimited));
    }
    Some(insert_direct(ct, c, pkt, l, fe, b, hop, baddr, reply_hash, in_port))
}

/// What [`new_flow_drawn`] did with a packet.
enum Drawn<'t> {
    /// Handled: the packet's verdict.
    Done(Verdict),
    /// Nothing done: the general route takes the packet.
    General,
    /// The new flow was admitted and its backend drawn (`None`: the service had none), but it
    /// is not of the direct kind (a hairpin, which is masqueraded, a backend without a next
    /// hop or behind a multipath route, or of the other family): the general route goes on
    /// from there.
    Picked(Option<&'t Backend>),
}

/// [`new_flow_direct`] for a new flow to a random service without affinity in NAT mode, from a
/// frontend without source ranges, not masqueraded (`Misses::drawn`): the flow is admitted
/// (the new-flow rate limit) and its backend drawn as [`new_flow`] would, in arrival order;
/// when the backend has a route and one next hop and is not the client, the flow is inserted
/// and the packet rewritten as the direct route does ([`insert_direct`]), else the general
/// route goes on with the draw ([`Drawn::Picked`]). [`Drawn::General`], nothing done, when the
/// flow table had an entry for the key in stage 3 or has one now. Always inlined (see
/// [`new_flow_direct`]).
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
#[inline(always)]
fn new_flow_drawn<'t, A: Fam, T: DirectTable<A>>(
    lanes: &Lanes<A>,
    ct: &mut T,
    c: &mut Common,
    t: &'t Tables,
    pkt: &mut Packet<'_>,
    lane: usize,
    m: &Misses<'t>,
    i: usize,
    in_port: u8,
) -> Drawn<'t> {
    let (Some(Some(Some(fe))), Some(l)) = (m.fe.get(i), lanes.as_slice().get(lane)) else {
        return Drawn::General;
    };
    if !still_new(ct, l) {
        return Drawn::General;
    }
    // A martian source: the general route drops it (`forward`).
    if l.key.src.is_martian_source() {
        return Drawn::General;
    }
    if !c.admit_new_flow() {
        return Drawn::Done(Verdict::Drop(DropReason::NewFlowRateLimited));
    }
    let (svc, key) = (&*fe.svc, l.key);
    // `new_flow`'s draw (`SchedState::pick` for a random service) without the dispatch.
    let Some(b) = c.sched.draw_random(svc).and_then(|r| t.backend(r)) else {
        return Drawn::Picked(None);
    };
    match (b.hop, A::from_ip(b.addr)) {
        (Some(hop), Some(baddr)) if b.single_hop && baddr != key.src => {
            // Stage 4 hashed the reply tuple for the backend it expected the draw to give.
            let reply_hash = match (m.guess.get(i), m.reply_hash.get(i)) {
                (Some(Some(g)), Some(&rh)) if g.this == b.this => rh,
                _ => ct.hash(&FlowKey { src: baddr, dst: key.src, sport: b.port, dport: key.sport, proto: key.proto }),
            };
            Drawn::Done(insert_direct(ct, c, pkt, l, fe, b, hop, baddr, reply_hash, in_port))
        }
        _ => Drawn::Picked(Some(b)),
    }
}

/// The direct route's new flow, admitted, of lane `l` through frontend `fe` to backend `b` (at
/// `baddr`, next hop `hop`), its reply tuple hashing to `reply_hash`: the record, built with its
/// rewrite (the checksum deltas from the two halves the tables keep, [`csum::dnat_deltas`]),
/// inserted under the two hashes; counts; the packet rewritten from the record.
#[expect(clippy::too_many_arguments, reason = "the fields of a new flow, from the stage inputs")]
#[inline(always)]
fn insert_direct<A: Fam, T: DirectTable<A>>(
    ct: &mut T,
    c: &mut Common,
    pkt: &mut Packet<'_>,
    l: &Lane<A>,
    fe: &FrontendEntry,
    b: &Backend,
    hop: Hop,
    baddr: A,
    reply_hash: u64,
    in_port: u8,
) -> Verdict {
    let (key, now) = (l.key, c.now_s);
    let state = initial_state_of(key.proto, l.tcp_flags);
    let svc = &*fe.svc;
    let mut r = new_record::<A>(c, &key, state, svc.id, b, baddr, in_port, wire::emit::src_mac(pkt.frame()));
    (r.ip_delta_fwd, r.ip_delta_rev, r.l4_delta) = csum::dnat_deltas(fe.dnat, b.dnat);
    (r.out_port, r.hop_mac, r.generation) = (hop.port, hop.dst_mac, c.generation);
    if let Err(e) = ct.insert(&r, l.hash, reply_hash, now, c) {
        return Verdict::Drop(insert_failed(e));
    }
    c.direct_flows += 1;
    c.sched.conns.add(b.this, state.is_active());
    c.count_new_flow(svc.id, b.this);
    if key.proto == proto::TCP && l.tcp_flags & tcp_flags::SYN == 0 {
        c.counters.event(Event::FlowPickedUp);
    }
    c.count_packet(svc.id, b.this);
    let tcp = key.proto == proto::TCP;
    match super::fast::nat_forward_lane::<A>(c, &r, pkt, l.l3, tcp) {
        Some(v) => v,
        None => ttl_expired_unparsed::<A>(c, pkt, in_port),
    }
}

/// Whether lane `l`'s flow is new for the direct routes: it missed in stage 3 and is still
/// absent (no entry with the key's hash bits was placed since, or one was and the key is not
/// it), as the general route would find: a miss.
#[inline(always)]
fn still_new<A: Fam, T: DirectTable<A>>(ct: &T, l: &Lane<A>) -> bool {
    l.miss && !(ct.may_have_placed(l.hash) && is_tracked(ct, &l.key, l.hash))
}

/// Whether the flow table has an entry for `key` (hash `h`): the direct route asks when the
/// batch's placed filter cannot rule it out (about one new flow in 16 in a batch of 64 new
/// flows). Out of line, so that the direct route does not carry the probe's code.
#[inline(never)]
fn is_tracked<A: Fam, T: DirectTable<A>>(ct: &T, key: &FlowKey<A>, h: u64) -> bool {
    ct.find(key, h).is_some()
}

/// The flow table as the direct routes use it: the whole table ([`Conntrack`], whose insert
/// evicts or reclaims when the table is full) or the table borrowed for a run of inserts while
/// it has room ([`conntrack::Inserter`], [`run_direct`]).
trait DirectTable<A: Fam> {
    /// As [`Conntrack::may_have_placed`].
    fn may_have_placed(&self, h: u64) -> bool;
    /// As [`Conntrack::find`].
    fn find(&self, k: &FlowKey<A>, h: u64) -> Option<Hit>;
    /// As [`Conntrack::hash`].
    fn hash(&self, k: &FlowKey<A>) -> u64;
    /// As [`Conntrack::insert_hashed`], a flow it removes (an eviction) counted off through
    /// `c` ([`Common::on_removed`]).
    fn insert(
        &mut self,
        r: &Rec<A>,
        fwd: u64,
        reply: u64,
        now_s: u32,
        c: &mut Common,
    ) -> Result<conntrack::RecId, conntrack::InsertError>;
}

impl<A: Fam> DirectTable<A> for Conntrack<A> {
    #[inline(always)]
    fn may_have_placed(&self, h: u64) -> bool {
        Self::may_have_placed(self, h)
    }
    #[inline(always)]
    fn find(&self, k: &FlowKey<A>, h: u64) -> Option<Hit> {
        Self::find(self, k, h)
    }
    #[inline(always)]
    fn hash(&self, k: &FlowKey<A>) -> u64 {
        Self::hash(self, k)
    }
    #[inline(always)]
    fn insert(
        &mut self,
        r: &Rec<A>,
        fwd: u64,
        reply: u64,
        now_s: u32,
        c: &mut Common,
    ) -> Result<conntrack::RecId, conntrack::InsertError> {
        self.insert_hashed(r, fwd, Some(reply), now_s, |x| c.on_removed(x))
    }
}

impl<A: Fam> DirectTable<A> for conntrack::Inserter<'_, A> {
    #[inline(always)]
    fn may_have_placed(&self, h: u64) -> bool {
        conntrack::Inserter::may_have_placed(self, h)
    }
    #[inline(always)]
    fn find(&self, k: &FlowKey<A>, h: u64) -> Option<Hit> {
        conntrack::Inserter::find(self, k, h)
    }
    #[inline(always)]
    fn hash(&self, k: &FlowKey<A>) -> u64 {
        conntrack::Inserter::hash(self, k)
    }
    #[inline(always)]
    fn insert(
        &mut self,
        r: &Rec<A>,
        fwd: u64,
        reply: u64,
        now_s: u32,
        _: &mut Common,
    ) -> Result<conntrack::RecId, conntrack::InsertError> {
        self.insert_room(r, fwd, Some(reply), now_s)
    }
}

/// Where [`run_direct`] stopped.
pub(super) enum RunStop<'t> {
    /// At the end of the slow packets, or at one it does not take (not fast-parsed, of the
    /// other family, not on a direct route) or when the table filled up: nothing done to that
    /// packet.
    Left,
    /// At packet `i`, taken off the slow packets: its new flow was found not to be of the
    /// direct kind, and the general route goes on with it, with `Some(draw)` when a random
    /// service's backend was drawn for it ([`Drawn::Picked`]; the general route must not
    /// admit or draw again), `None` when nothing was done ([`Drawn::General`], or
    /// [`new_flow_direct`] declined).
    General(usize, Option<Option<&'t Backend>>),
}

/// Stage 5 for a run of the slow packets `*rest` (bit `i`: packet `i`), from the lowest, in
/// arrival order: while each is a fast-parsed packet of family `A` that stage 4 marked for a
/// direct route and the flow table has room, its new flow goes through [`new_flow_direct`] or
/// [`new_flow_drawn`] with the table borrowed once for the run ([`conntrack::Inserter`]).
/// Clears from `*rest` the packets it handled (and the one it stops at with
/// [`RunStop::General`]); a full table takes the per-packet route ([`run_lane`]), which evicts.
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
#[inline(always)]
pub(super) fn run_direct<'t, A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &'t Tables,
    pkts: &mut [Packet<'_>],
    verdicts: &mut [Verdict],
    lane_of: &[u8; BATCH],
    m: &Misses<'t>,
    rest: &mut u64,
    in_port: u8,
) -> RunStop<'t> {
    let (lanes, mut ct) = (&st.lanes, st.ct.inserter());
    while *rest != 0 && ct.has_room() {
        let i = rest.trailing_zeros() as usize & 63;
        let lane = lane_of.get(i).copied().unwrap_or(super::NO_LANE);
        if lane == super::NO_LANE || lane & super::V6_LANE != A::LANE_FLAG || !m.is_direct_or_drawn(i) {
            return RunStop::Left;
        }
        let (Some(pkt), Some(v)) = (pkts.get_mut(i), verdicts.get_mut(i)) else { return RunStop::Left };
        let lane = usize::from(lane & !super::V6_LANE);
        *rest &= *rest - 1;
        if m.is_direct(i) {
            match new_flow_direct::<A, _>(lanes, &mut ct, c, pkt, lane, m, i, in_port) {
                Some(x) => *v = x,
                None => return RunStop::General(i, None),
            }
        } else {
            match new_flow_drawn::<A, _>(lanes, &mut ct, c, t, pkt, lane, m, i, in_port) {
                Drawn::Done(x) => *v = x,
                Drawn::General => return RunStop::General(i, None),
                Drawn::Picked(b) => return RunStop::General(i, Some(b)),
            }
        }
    }
    RunStop::Left
}

/// Applies the forwarding mode of record `r` to a client → service packet of the slow path
/// that arrived on `in_port`: next hop, MTU check (RFC 1191 / RFC 8201 answer), TTL, the
/// fragment record of a first fragment, then the rewrite. An ICMP error answering the packet
/// leaves on `in_port`, to the MAC the packet came from: the flow's first packet may have come
/// in on another port (`r.in_port`, where its replies go).
#[expect(clippy::too_many_arguments, reason = "the pipeline's stage inputs, all borrowed")]
fn transmit_forward<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    r: &Rec<A>,
    b: &Backend,
    in_port: u8,
) -> Verdict {
    let Some(hop) = flow_hop(t, b, r) else { return Verdict::Drop(DropReason::NoNeighbour) };
    if r.flags & flow_flags::MTU_CHECK != 0
        && let Some(v) = too_big::<A>(c, pkt, p, FragAction::L2, hop, in_port)
    {
        return v;
    }
    if r.flags & flow_flags::DSR == 0 && super::fast::shaped::<A>(p) {
        // The packet has the fast parser's shape: the record's precomputed rewrite applies.
        return match super::fast::nat_forward::<A>(c, r, pkt, p) {
            Some(v) => v,
            None => ttl_expired::<A>(c, pkt, p, in_port),
        };
    }
    let action = if r.flags & flow_flags::DSR == 0 {
        FragAction::Nat { src: r.reply_dst, dst: r.backend_addr }
    } else if r.flags & flow_flags::ENCAP != 0 {
        let Some(outer_src) = outer_source::<A>(t, flow_hash_of(r)) else {
            return Verdict::Drop(DropReason::NoSourceAddress);
        };
        FragAction::Encap { outer_src, outer_dst: r.backend_addr, flow_hash: flow_hash_of(r) }
    } else {
        FragAction::L2
    };
    if matches!(action, FragAction::Encap { .. })
        && let Some(v) = too_big::<A>(c, pkt, p, action, hop, in_port)
    {
        return v;
    }
    let snat = r.flags & flow_flags::SNAT != 0;
    if matches!(action, FragAction::Nat { .. }) && sctp_fragment_port_change(p, r.bport, snat.then_some(r.reply_dport))
    {
        return Verdict::Drop(DropReason::FragmentUnrewritable);
    }
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        return ttl_expired::<A>(c, pkt, p, in_port);
    }
    if let Frag::First { id } = p.frag {
        let e = FragEntry { action, hop, backend: b.this, expires_s: c.now_s.saturating_add(c.cfg.frag_timeout_s) };
        let (src, dst) = (r.client, r.vip);
        if st.frag.insert(FragKey { src, dst, id, proto: frag_proto(pkt.frame(), p) }, e, c.now_s) == Room::EvictedLive
        {
            c.counters.event(Event::FragmentEvicted);
        }
    }
    apply(pkt, p, action, r.bport, r.reply_dport, snat, hop)
}

/// The answer to a client's packet of a flow to a VIP whose TTL / hop limit would reach 0 on
/// its way to the backend (the frame untouched: the rewrites check it before their first
/// write): ICMP time exceeded in transit from the VIP (the packet's destination) back out of
/// `in_port` (RFC 1812 §5.3.1; IPVS's `decrement_ttl` answers so, from the VIP it holds), within
/// the worker's budget of ICMP errors; else a `ttl_exceeded` drop (no error may answer it,
/// [`icmp::may_answer`]: a later IPv4 fragment, a source of no single host; or the budget is
/// spent). Replies, later fragments (their series may be a reply's) and translated ICMP
/// errors whose TTL runs out are dropped without an answer (a reply's destination is no
/// address of the node's; an error never answers an error).
#[cold]
#[inline(never)]
fn ttl_expired<A: Fam>(c: &mut Common, pkt: &mut Packet<'_>, p: &Parsed, in_port: u8) -> Verdict {
    if icmp::may_answer::<A>(pkt.frame(), p) && c.admit_icmp_error() && icmp::time_exceeded::<A>(pkt, p) {
        c.counters.event(Event::TimeExceededSent);
        return Verdict::Tx { port: in_port };
    }
    Verdict::Drop(DropReason::TtlExceeded)
}

/// [`ttl_expired`] for a fast-parsed packet of the direct routes, which carry no full parse:
/// the frame is parsed here.
#[cold]
#[inline(never)]
fn ttl_expired_unparsed<A: Fam>(c: &mut Common, pkt: &mut Packet<'_>, in_port: u8) -> Verdict {
    match wire::parse(pkt.frame()) {
        Ok(Some(p)) => ttl_expired::<A>(c, pkt, &p, in_port),
        _ => Verdict::Drop(DropReason::TtlExceeded),
    }
}

/// Whether `p` is an SCTP first fragment whose destination port becomes `dport` and, if
/// given, whose source port becomes `sport`, with either changing. Its CRC32c covers the whole
/// packet (RFC 9260 §6.8), most of which is in the later fragments, so unlike a checksum delta
/// it cannot follow the change: the reassembled packet would fail it at its receiver.
fn sctp_fragment_port_change(p: &Parsed, dport: u16, sport: Option<u16>) -> bool {
    p.proto == proto::SCTP
        && matches!(p.frag, Frag::First { .. })
        && (p.dport != dport || sport.is_some_and(|s| s != p.sport))
}

/// The answer to a packet that would exceed the MTU of `hop` (0: none known) once `action`
/// is applied (RFC 1191 / RFC 8201): "fragmentation needed" / "packet too big" out of
/// `in_port` when it may not be fragmented, else a `TooBig` drop (xlb does not fragment).
/// Encapsulation adds its outer header; NAT and MAC-only DSR keep the size, so a packet is too
/// big for them only where the port it leaves on has a smaller MTU than the one it arrived on
/// ([`flow_flags::MTU_CHECK`]). `None` when it fits.
fn too_big<A: Fam>(
    c: &mut Common,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    action: FragAction<A>,
    hop: Hop,
    in_port: u8,
) -> Option<Verdict> {
    let add = if matches!(action, FragAction::Encap { .. }) { A::HEADER_LEN } else { 0 };
    let inner = p.end - p.l3;
    if inner + add <= usize::from(hop.mtu) || hop.mtu == 0 {
        return None;
    }
    let df = A::IS_V6 || pkt.frame().get(p.l3..).is_some_and(wire::emit::ipv4_dont_frag);
    let mtu = hop.mtu.saturating_sub(u16::try_from(add).unwrap_or(0));
    if df && !icmp::may_answer::<A>(pkt.frame(), p) {
        return Some(Verdict::Drop(DropReason::IcmpErrorForbidden));
    }
    if df && !c.admit_icmp_error() {
        return Some(Verdict::Drop(DropReason::IcmpRateLimited));
    }
    if df && icmp::too_big::<A>(pkt, p, mtu) {
        c.counters.event(Event::TooBigSent);
        return Some(Verdict::Tx { port: in_port });
    }
    Some(Verdict::Drop(DropReason::TooBig))
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

/// A reply of a NAT flow (backend → client or → SNAT address) that the fast stage left:
/// restore the VIP as source and, for SNAT flows, the client as destination; send it back where
/// the client's packets came from.
fn reply<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    hit: Hit,
    in_port: u8,
) -> Verdict {
    let Some(mut r) = st.ct.rec(hit.id).copied() else { return Verdict::Pass };
    let now = c.now_s;
    let old = r.ct_state();
    let new = if p.proto == proto::TCP { conntrack::tcp_next(old, p.tcp_flags) } else { old };
    r.state = new as u8;
    r.expires_s = now.saturating_add(c.timeout(new));
    c.sched.conns.change(r.backend, old.is_active(), new.is_active());
    if let Some(b) = t.backend(r.backend)
        && let Some(svc) = t.services.get(b.service as usize)
    {
        c.count_packet(svc.id, b.this);
        refresh::<A>(&mut r, c, t, b, svc.id);
    }
    if let Some(x) = st.ct.rec_mut(hit.id) {
        write_refreshed(x, &r, false);
    }
    if new.is_evictable() != old.is_evictable() {
        st.ct.set_evictable(&hit, new.is_evictable());
    }
    let src_mac = {
        let port = c.port(r.in_port);
        if port.known { port.mac } else { wire::emit::dst_mac(pkt.frame()) }
    };
    // The client's port's MTU, for a flow whose two ports differ in it (the later fragments'
    // record keeps it too); 0, nothing to check, otherwise.
    let mtu = if r.flags & flow_flags::MTU_CHECK != 0 { c.port_mtu(r.in_port) } else { 0 };
    let hop = Hop { port: r.in_port, dst_mac: r.peer_mac, src_mac, mtu };
    if let Some(v) = too_big::<A>(c, pkt, p, FragAction::L2, hop, in_port) {
        return v;
    }
    let snat = r.flags & flow_flags::SNAT != 0;
    if sctp_fragment_port_change(p, if snat { r.cport } else { p.dport }, Some(r.vport)) {
        return Verdict::Drop(DropReason::FragmentUnrewritable);
    }
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    if let Frag::First { id } = p.frag {
        let e = FragEntry {
            action: FragAction::Nat { src: r.vip, dst: r.client },
            hop,
            backend: r.backend,
            expires_s: now.saturating_add(c.cfg.frag_timeout_s),
        };
        let (src, dst) = (r.backend_addr, r.reply_dst);
        if st.frag.insert(FragKey { src, dst, id, proto: frag_proto(pkt.frame(), p) }, e, now) == Room::EvictedLive {
            c.counters.event(Event::FragmentEvicted);
        }
    }
    let f = pkt.frame_mut();
    nat::set_src::<A>(f, p, r.vip);
    nat::set_sport::<A>(f, p, r.vport);
    if snat {
        nat::set_dst::<A>(f, p, r.client);
        nat::set_dport::<A>(f, p, r.cport);
    }
    nat::set_macs(f, hop.src_mac, hop.dst_mac);
    Verdict::Tx { port: hop.port }
}

/// The protocol a fragment series is keyed by: the Next Header of the IPv6 Fragment header,
/// which names the first header of the fragmentable part and is the same in every fragment
/// (RFC 8200 §4.5; the first fragment's `proto` is the L4 protocol after the headers that part
/// may begin with), else the IPv4 protocol field.
#[inline]
fn frag_proto(f: &[u8], p: &Parsed) -> u8 {
    if p.frag_hdr == 0 { p.proto } else { f.get(p.frag_hdr).copied().unwrap_or(p.proto) }
}

fn later_fragment<A: Fam>(
    st: &mut FamState<A>,
    c: &mut Common,
    t: &Tables,
    pkt: &mut Packet<'_>,
    p: &Parsed,
    k: FragKey<A>,
    in_port: u8,
) -> Verdict {
    let Some(e) = st.frag.get(&k, c.now_s) else { return fragment_of_another_worker::<A>(c, t, &k) };
    // The first fragment fit after encapsulation; a later one may not (a smaller first
    // fragment, or one cut again on the way): the same check, not an oversized frame.
    if let Some(v) = too_big::<A>(c, pkt, p, e.action, e.hop, in_port) {
        return v;
    }
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        // Unanswered (`ttl_expired` answers a client's packet to a VIP): the series may be a
        // backend's reply, whose destination is no address of the node's, and over IPv4 no
        // error may answer a later fragment anyway.
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

/// A later fragment (`k`: its series) whose first fragment this worker has not seen. A
/// reply's first fragment is handed to the worker that holds its flow ([`run_l4`]) and records
/// the series there, while RSS puts the later ones, which carry no ports, where the first one
/// arrived: a series to the SNAT address or to none of xlb's addresses (a DNAT reply, to the
/// client) goes to the workers in turn (the worker punts it once every one has looked). A
/// series to a VIP is the client's: its first fragment, on the same queue, created the record
/// here or nowhere; but an ICMP datagram's (an echo request larger than the link) goes to the
/// kernel, as its first fragment and an unfragmented one do.
fn fragment_of_another_worker<A: Fam>(c: &Common, t: &Tables, k: &FragKey<A>) -> Verdict {
    let to_vip = t.vip_addrs.get(&k.dst.to_mapped()).is_some_and(|kind| *kind >= VipAddrKind::Service);
    if to_vip {
        return if k.proto == A::ICMP { Verdict::Pass } else { Verdict::Drop(DropReason::FragmentUntracked) };
    }
    if let Some(worker) = c.cfg.next_worker() {
        return Verdict::Handoff { worker };
    }
    if A::snat(t) == Some(k.dst) { Verdict::Drop(DropReason::FragmentUntracked) } else { Verdict::Pass }
}

/// An ICMP error addressed to a VIP or the SNAT address. Its quoted datagram, read backwards,
/// is one of a flow's two tuples:
/// - the client's tuple: it quotes a packet xlb sent to a client (source VIP), so a router on
///   the client side reports on the flow (e.g. PMTU). It goes to the backend that owns the
///   flow, with outer destination and quoted source rewritten to the backend (and the quoted
///   destination to the SNAT tuple for SNAT flows), or encapsulated for DSR;
/// - the reply tuple: it quotes a packet xlb sent to a backend. It goes to the client, with
///   the quoted packet and the outer destination restored to the client's view.
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
    let k = FlowKey { src: qdst, dst: qsrc, sport: q.dport, dport: q.sport, proto: q.proto };
    let h = st.ct.hash(&k);
    let hit = match lookup(st, c, &k, h) {
        Found::Live(hit) => hit,
        Found::Expired => return Verdict::Drop(DropReason::IcmpUntracked),
        Found::Miss => return icmp_of_another_worker::<A>(c, t, &k),
    };
    let Some(fl) = st.ct.rec(hit.id).copied() else { return Verdict::Drop(DropReason::IcmpUntracked) };
    // The translation writes a checksum computed afresh: an error corrupted on its way must be
    // caught before that, or it would leave with a checksum that vouches for the corruption.
    if !icmp::checksum_ok::<A>(pkt.frame(), p.l3, p.l4, p.end) {
        return Verdict::Drop(DropReason::MalformedL4);
    }
    if hit.dir == Dir::Forward {
        let Some(b) = t.backend(fl.backend) else { return Verdict::Drop(DropReason::IcmpUntracked) };
        let Some(svc) = t.services.get(b.service as usize) else { return Verdict::Pass };
        let Some(hop) = flow_hop(t, b, &fl) else { return Verdict::Drop(DropReason::NoNeighbour) };
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
                if fl.flags & flow_flags::SNAT != 0 {
                    // The address the flow was masqueraded to, which its backend talks to: the
                    // tables' SNAT address may have changed since.
                    nat::set_dst::<A>(fr, &q, fl.reply_dst);
                    nat::set_dport::<A>(fr, &q, fl.reply_dport);
                }
                nat::set_dst::<A>(fr, p, baddr);
                icmp::refresh_icmp_checksum::<A>(fr, p.l3, p.l4, p.end);
                FragAction::L2
            }
            ForwardingMode::DsrIpip => {
                let Some(outer_src) = outer_source::<A>(t, 0) else {
                    return Verdict::Drop(DropReason::NoSourceAddress);
                };
                FragAction::Encap { outer_src, outer_dst: baddr, flow_hash: 0 }
            }
            ForwardingMode::DsrL2 => FragAction::L2,
        };
        return apply(pkt, p, action, 0, 0, false, hop);
    }
    // The reply tuple: quoted = xlb → backend (SNAT or DNAT flow).
    if !nat::dec_ttl::<A>(pkt.frame_mut(), p) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    let outer_src: A = nat::src(pkt.frame(), p);
    let fr = pkt.frame_mut();
    let fr = fr.get_mut(..p.end).unwrap_or(&mut []);
    nat::set_src::<A>(fr, &q, fl.client);
    nat::set_sport::<A>(fr, &q, fl.cport);
    nat::set_dst::<A>(fr, &q, fl.vip);
    nat::set_dport::<A>(fr, &q, fl.vport);
    if outer_src == qdst {
        // The backend itself reports (e.g. its port unreachable): it speaks for the VIP.
        nat::set_src::<A>(fr, p, fl.vip);
    }
    nat::set_dst::<A>(fr, p, fl.client);
    icmp::refresh_icmp_checksum::<A>(fr, p.l3, p.l4, p.end);
    let port = c.port(fl.in_port);
    let src_mac = if port.known { port.mac } else { wire::emit::dst_mac(fr) };
    nat::set_macs(fr, src_mac, fl.peer_mac);
    c.counters.event(Event::IcmpTranslated);
    Verdict::Tx { port: fl.in_port }
}

/// An ICMP error whose flow (`k`: its tuple as the flow sees it) this worker does not have.
/// RSS hashes ICMP by its addresses alone, so the error seldom reaches the queue of the flow's
/// packets: like a reply ([`run_l4`]), it goes to the owner of the SNAT port it quotes, else to
/// the workers in turn (the worker punts it once every one has looked).
fn icmp_of_another_worker<A: Fam>(c: &Common, t: &Tables, k: &FlowKey<A>) -> Verdict {
    if A::snat(t) == Some(k.dst) {
        return match c.cfg.snat_owner(k.dport) {
            Some(w) if w != c.cfg.worker_id => Verdict::Handoff { worker: w },
            _ => Verdict::Drop(DropReason::IcmpUntracked),
        };
    }
    if let Some(worker) = c.cfg.next_worker() {
        return Verdict::Handoff { worker };
    }
    Verdict::Drop(DropReason::IcmpUntracked)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use proptest::prelude::*;

    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    use std::sync::Arc;

    use super::{FrontendCache, Rec, initial_state_of, initial_tcp_state, set_rewrite};
    use crate::addr::{Family, V4, V6, mapped};
    use crate::conntrack::CtState;
    use crate::csum::{DnatHalf, dnat_deltas};
    use crate::tables::{
        BackendSpec, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, Scheduler, ServiceSpec,
        TableBuilder, Tables, TablesSpec,
    };
    use crate::wire::{proto, tcp_flags};

    /// Tables whose services each have one frontend, `(address, protocol, port)` in `fes`, and
    /// one backend; the service of frontend `i` is named by `names(i)`.
    fn tables_with(fes: &[(IpAddr, L4Proto, u16)], names: impl Fn(usize) -> String) -> Tables {
        let services = fes
            .iter()
            .enumerate()
            .map(|(i, &(addr, proto, port))| {
                Arc::new(ServiceSpec {
                    name: names(i),
                    frontends: vec![Frontend::new(addr, proto, port, FrontendKind::ClusterIp, false)],
                    scheduler: Scheduler::Random,
                    affinity_timeout_s: None,
                    mode: ForwardingMode::Nat,
                    when_empty: EmptyAction::Reject,
                    backends: vec![BackendSpec::ready(
                        if addr.is_ipv4() {
                            IpAddr::V4(Ipv4Addr::new(10, 5, 0, 1))
                        } else {
                            IpAddr::V6(Ipv6Addr::new(0xfd00, 5, 0, 0, 0, 0, 0, 1))
                        },
                        8000,
                    )],
                })
            })
            .collect();
        let spec = TablesSpec {
            services,
            ports: vec![],
            neighbours: vec![],
            routes: vec![],
            kernel_routes: vec![],
            multipath_l4: false,
            snat_v4: None,
            snat_v6: None,
            dsr_source_v4: None,
            dsr_source_v6: None,
            maglev_max_size: 0,
            maglev_min_size: 0,
            cluster_cidrs: vec![],
        };
        TableBuilder::new().build(&spec).unwrap_or_else(|e| panic!("spec: {e}"))
    }

    /// Stage 4's frontend cache gives what the tables' map gives, for every key, hit or miss:
    /// 6,000 frontends (more than its 4,096 slots, so keys share slots and evict each other),
    /// IPv4 and IPv6, TCP and UDP, ports and addresses next to each other, keys without a
    /// frontend; then, warm, over a second snapshot built apart (its handles name other keys)
    /// in which a third of the frontends are gone and the rest belong to other services.
    #[test]
    fn the_frontend_cache_gives_what_the_map_gives_across_snapshots() {
        let mut fes = Vec::new();
        for i in 0..2000u16 {
            let [a, b] = i.to_be_bytes();
            fes.push((IpAddr::V4(Ipv4Addr::new(10, 96, a, b)), L4Proto::Tcp, 80));
            fes.push((IpAddr::V4(Ipv4Addr::new(10, 96, a, b)), L4Proto::Udp, 80));
            fes.push((IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i)), L4Proto::Tcp, 443 + i % 3));
        }
        let t1 = tables_with(&fes, |i| format!("ns/svc-{i}:p"));
        let kept: Vec<_> = fes.iter().copied().enumerate().filter(|(i, _)| i % 3 != 1).map(|(_, f)| f).collect();
        let t2 = tables_with(&kept, |i| format!("other/svc-{i}:p"));
        // Every frontend, and keys next to them that have none.
        let mut keys: Vec<([u8; 16], u8, u16)> = Vec::new();
        for &(addr, p, port) in &fes {
            let mapped = match addr {
                IpAddr::V4(a) => V4(a.octets()).to_mapped(),
                IpAddr::V6(a) => V6(a.octets()).to_mapped(),
            };
            let p = if p == L4Proto::Tcp { proto::TCP } else { proto::UDP };
            keys.push((mapped, p, port));
            keys.push((mapped, p, port + 1000));
        }
        let name = |t: &Tables, fe: Option<&crate::tables::FrontendEntry>| {
            fe.map(|fe| (fe.service, t.services.get(fe.service as usize).map(|s| s.name.clone())))
        };
        let mut cache = FrontendCache::new();
        let mut found = 0;
        for t in [&t1, &t1, &t2, &t2, &t1] {
            for &(addr, p, port) in &keys {
                let want = name(t, t.frontend(addr, p, port));
                found += usize::from(want.is_some());
                assert_eq!(name(t, cache.get(t, addr, p, port)), want, "{addr:?} {p}/{port}");
            }
        }
        assert_eq!(found, 3 * 6000 + 2 * 4000, "the keys with a frontend in each pass");
    }

    /// A new flow's state read from the table is the one its flags give, whatever other bits
    /// (PSH, URG, ECE, CWR) they carry: a SYN starts `SynSent`, a SYN-ACK, an ACK or a data
    /// segment a picked-up `Established` flow, a FIN `FinWait`, an RST `Closed`; UDP is
    /// `Datagram`.
    #[test]
    fn a_new_flows_state_from_the_table_is_the_one_its_flags_give() {
        for f in 0..=u8::MAX {
            assert_eq!(initial_state_of(proto::TCP, f), initial_tcp_state(f), "flags {f:#04x}");
            assert_eq!(initial_state_of(proto::UDP, f), CtState::Datagram);
        }
        let (syn, ack, fin, rst, psh) =
            (tcp_flags::SYN, tcp_flags::ACK, tcp_flags::FIN, tcp_flags::RST, tcp_flags::PSH);
        for (f, want) in [
            (syn, CtState::SynSent),
            (syn | psh, CtState::SynSent),
            (syn | ack, CtState::Established),
            (ack, CtState::Established),
            (ack | psh, CtState::Established),
            (fin | ack, CtState::FinWait),
            (rst, CtState::Closed),
            (rst | ack, CtState::Closed),
        ] {
            assert_eq!(initial_state_of(proto::TCP, f), want, "flags {f:#04x}");
        }
    }

    /// The general rewrite's deltas of a DNAT record (source unchanged).
    fn general<A: super::Fam>(client: A, vip: A, backend: A, cport: u16, vport: u16, bport: u16) -> (u16, u16, u16) {
        let mut r = Rec::<A>::zeroed_record();
        (r.client, r.reply_dst, r.vip, r.backend_addr) = (client, client, vip, backend);
        (r.cport, r.reply_dport, r.vport, r.bport) = (cport, cport, vport, bport);
        set_rewrite::<A>(&mut r, 0);
        (r.ip_delta_fwd, r.ip_delta_rev, r.l4_delta)
    }

    proptest! {
        /// The direct route's deltas, from a frontend's and a backend's halves summed as the
        /// tables sum them (over the 16-byte key form of the address, IPv4-mapped for IPv4),
        /// are the general rewrite's for every DNAT tuple, IPv4 and IPv6.
        #[test]
        fn dnat_deltas_from_the_tables_halves_are_the_general_rewrites(
            c in any::<[u8; 16]>(), v in any::<[u8; 16]>(), b in any::<[u8; 16]>(),
            cp in any::<u16>(), vp in any::<u16>(), bp in any::<u16>(), same in any::<bool>(),
        ) {
            // Now and then the backend is the VIP itself (a zero delta).
            let b = if same { v } else { b };
            let (c4, v4, b4) = (V4([c[0], c[1], c[2], c[3]]), V4([v[0], v[1], v[2], v[3]]), V4([b[0], b[1], b[2], b[3]]));
            let half = |f: fn(&[u8], u16) -> DnatHalf, a: IpAddr, p| f(&mapped(a), p);
            let (ipv4, ipv6) = (|x: V4| IpAddr::V4(Ipv4Addr::from(x.0)), |x: V6| IpAddr::V6(Ipv6Addr::from(x.0)));
            let (o4, n4) = (half(DnatHalf::of_old, ipv4(v4), vp), half(DnatHalf::of_new, ipv4(b4), bp));
            prop_assert_eq!(dnat_deltas(o4, n4), general(c4, v4, b4, cp, vp, bp));
            // The same halves over the four octets alone.
            prop_assert_eq!((DnatHalf::of_old(&v4.0, vp), DnatHalf::of_new(&b4.0, bp)), (o4, n4));
            let (o6, n6) = (half(DnatHalf::of_old, ipv6(V6(v)), vp), half(DnatHalf::of_new, ipv6(V6(b)), bp));
            prop_assert_eq!(dnat_deltas(o6, n6), general(V6(c), V6(v), V6(b), cp, vp, bp));
        }
    }

    #[test]
    fn generation_zero_marks_unstamped_records() {
        let t = crate::tables::Tables::empty();
        assert_eq!(super::super::gen32(&t), 0);
    }

    #[test]
    fn pipeline_exports_its_conntrack_capacity() {
        use super::super::{Pipeline, PipelineConfig};
        let p = Pipeline::new(PipelineConfig { conntrack_capacity: 1000, ..PipelineConfig::default() }, 1);
        assert_eq!(p.counters().ct_capacity.get(), 1000);
    }
}
