//! Stage 3 of the batch: packets of known flows whose record is current are rewritten from
//! the record alone, without touching the tables.
//!
//! A record is current when it was stamped with the generation of the tables this batch
//! runs on (so its backend, next hop, service and frontend are what the tables say), has not
//! expired, and no earlier packet of its flow in this batch waits for the slow path. A packet
//! that needs anything else (TTL about to expire, a SYN reusing a closing flow's tuple, an
//! encapsulation that would exceed the MTU) is left untouched and goes to the slow path,
//! which handles it as before.
//!
//! Offsets come from the fast parser: Ethernet plus at most one 802.1Q tag, then an IP header
//! without options or extension headers, then at least 20 (TCP) or 8 (UDP) bytes of transport
//! header. The rewrites are instantiated for each of the two IP header offsets (14, 18) and
//! both transport protocols, so every field is at a constant offset and one bounds check
//! covers all the writes of a packet. A batch whose frames are all IPv4 TCP, or all IPv6 TCP,
//! behind an untagged Ethernet header runs a second instance of the stage, `stage_shaped`, in
//! which the IP offset and the protocol are constants (`Pipeline::batch_shaped`).

use crate::addr::Family;
use crate::conntrack::{CtState, Dir, Rec, flow_flags, tcp_next};
use crate::csum::{self, L4Sum};
use crate::nat::Packet;
use crate::wire::{Frag, Parsed, emit, proto, tcp_flags};

use super::{Common, Fam, FamState, Lane, Verdict, slow};

/// One lane of stage 3 (the body of [`stage`] and [`stage_shaped`]'s loops): resolves the
/// lane's flow, rewrites its packet `$pkt` from the record and writes its verdict `$v`, or runs
/// `$slow` (which leaves the iteration) when the packet goes to the slow path. `where (pkt, v) =
/// ...` gets the packet and verdict after the flow is resolved (the general stage's lanes name
/// their packet by index; the common shape's walk with them). A macro, so that each stage's
/// loop takes the form its compiled code measured best in: the general stage's inline (through
/// a closure, 4 to 11 instructions more per packet, callgrind), the common shape's through a
/// closure (7 fewer than inline).
macro_rules! fast_lane {
    ($view:ident, $deferred:ident, $c:ident, $now:ident, $generation:ident, $shaped:literal, $rewrite:ident,
     $l:ident, $pkt:ident, $v:ident, $slow:block $(where ($p2:ident, $v2:ident) = $get:expr)?) => {{
        let Some((hit, r)) = $view.resolve(&$l.key, $l.hash, &$l.probe) else {
            $l.miss = true;
            $slow
        };
        $(let (Some($p2), Some($v2)) = $get else { continue };)?
        let old = r.ct_state();
        let is_tcp = $shaped || $l.key.proto == proto::TCP;
        // A SYN on the tuple of a closing connection starts a new one: the slow path replaces
        // the flow (IPVS conn_reuse_mode); a backend's SYN on its reply tuple answers a
        // connection that did not come through xlb, and the slow path forgets the flow.
        let reuse = is_tcp
            && $l.tcp_flags & tcp_flags::SYN != 0
            && (hit.dir == Dir::Reply || $l.tcp_flags & tcp_flags::ACK == 0)
            && matches!(old, CtState::FinWait | CtState::Closed);
        // The record's rewrite applies: made under these tables, not expired, not a
        // reused tuple, no earlier packet of the flow waiting in the slow path, and the
        // packet no larger than the port it leaves on (`MTU_CHECK` flows only, tested with
        // `DEFERRED` in one mask, `fits` out of line). The flags are tested last: tested
        // before `reuse`, the two were computed as bytes and or-ed (3 instructions more per
        // packet, callgrind, docs/benchmarks.md).
        let applies = r.generation == $generation
            && r.expires_s >= $now
            && !reuse
            && (r.flags & (flow_flags::DEFERRED | flow_flags::MTU_CHECK) == 0 || fits::<A>($c, hit.dir, r, $l.seg));
        let out = if applies { $rewrite::<A>($c, hit.dir, r, $pkt, $l, is_tcp) } else { None };
        let Some(port) = out else {
            if r.flags & flow_flags::DEFERRED == 0 {
                r.flags |= flow_flags::DEFERRED;
                $deferred.push(hit.id);
            }
            $slow
        };
        *$v = Verdict::Tx { port };
        // Only SYN, FIN and RST move an established flow's state (`tcp_next`).
        let new = if !is_tcp
            || (old == CtState::Established
                && $l.tcp_flags & (tcp_flags::SYN | tcp_flags::FIN | tcp_flags::RST) == 0)
        {
            old
        } else {
            tcp_next(old, $l.tcp_flags)
        };
        r.expires_s = $c.expiry(new);
        $c.count_packet(r.svc, r.backend);
        if new != old {
            r.state = new as u8;
            $c.sched.conns.change(r.backend, old.is_active(), new.is_active());
            if new.is_evictable() != old.is_evictable() {
                $view.set_evictable(&hit, new.is_evictable());
            }
        }
    }};
}

/// Defines a stage 3 function (`$stage`) and the rewrite it calls (`$rewrite`) from one source.
/// `shaped = true`: every lane is TCP right behind an untagged Ethernet header (`l3` 14,
/// `wire::parse_fast_v4_tcp` or `wire::parse_fast_v6_tcp`), so the rewrite's offsets and
/// protocol are constants. The two
/// instances are separate functions rather than one function generic over the shape: measured
/// with callgrind, the generic one compiled to 17 to 21 more instructions per packet in each
/// instance (`docs/benchmarks.md`).
macro_rules! fast_stage {
    ($(#[$doc:meta])* $stage:ident, $rewrite:ident, shaped = $shaped:literal) => {
        $(#[$doc])*
        #[inline]
        pub(super) fn $stage<A: Fam>(
            st: &mut FamState<A>,
            c: &mut Common,
            pkts: &mut [Packet<'_>],
            verdicts: &mut [Verdict],
        ) -> (u64, u64) {
            let (mut slow, mut tx) = (0u64, 0u64);
            if st.lanes.n == 0 {
                return (0, 0);
            }
            let (now, generation) = (c.now_s, c.generation);
            // Both cut to one length, so that one bounds check per lane covers both.
            let n = pkts.len().min(verdicts.len());
            let (Some(pkts), Some(verdicts)) = (pkts.get_mut(..n), verdicts.get_mut(..n)) else { return (0, 0) };
            let mut view = st.ct.view_mut();
            let deferred = &mut st.deferred;
            if $shaped {
                // Lane `i` is packet `i` (`Pipeline::stage1_shaped`): walked together, no
                // index to check.
                // Through a closure: the lane's code inline in this loop measured 7 instructions
                // more per packet (callgrind), the other way round from the general stage's.
                let mut step = |l: &mut Lane<A>, pkt: &mut Packet<'_>, v: &mut Verdict| -> bool {
                    fast_lane!(view, deferred, c, now, generation, $shaped, $rewrite, l, pkt, v, { return false });
                    true
                };
                let lanes = st.lanes.as_mut_slice();
                for (i, ((l, pkt), v)) in lanes.iter_mut().zip(pkts.iter_mut()).zip(verdicts.iter_mut()).enumerate() {
                    if step(l, pkt, v) {
                        tx += 1;
                    } else {
                        slow |= 1u64 << (i & 63);
                    }
                }
            } else {
                for l in st.lanes.as_mut_slice() {
                    let i = usize::from(l.pkt);
                    fast_lane!(view, deferred, c, now, generation, $shaped, $rewrite, l, pkt, v, {
                        slow |= 1u64 << (i & 63);
                        continue;
                    } where (pkt, v) = (pkts.get_mut(i), verdicts.get_mut(i)));
                    tx += 1;
                }
            }
            (slow, tx)
        }

        /// Rewrites one packet of a known flow from its record: DNAT/SNAT forward, the reply of a NAT
        /// flow, or DSR (MAC only, or encapsulation); returns the port to transmit it on. `None`,
        /// frame untouched, when the slow path must act (TTL about to expire, no room or MTU for
        /// encapsulation). The port rather than a [`Verdict`]: stage 3 writes the verdict's two
        /// bytes, where it copied a whole `Verdict` (2 instructions more per packet, callgrind).
        #[inline(always)]
        fn $rewrite<A: Fam>(
            c: &Common,
            dir: Dir,
            r: &Rec<A>,
            pkt: &mut Packet<'_>,
            l: &Lane<A>,
            tcp: bool,
        ) -> Option<u8> {
            let l3 = if $shaped { 14 } else { l.l3 };
            let nat_flow = r.flags & flow_flags::DSR == 0;
            match dir {
                Dir::Forward if nat_flow => {
                    // The record's fields are read after the frame's checks (`nat_at`), each just before
                    // it is written, so they need not be held in registers (or spilled) meanwhile.
                    let to = |_: &[u8]| forward_nat(c, r);
                    nat::<A>(pkt.buf, pkt.head, l3, tcp, to).then_some(r.out_port)
                }
                Dir::Reply => {
                    let to = |h: &[u8]| {
                        let port = c.port(r.in_port);
                        let smac =
                            if port.known { port.mac } else { h.first_chunk::<6>().copied().unwrap_or_default() };
                        Nat {
                            src: r.vip,
                            dst: r.client,
                            sport: r.vport,
                            dport: r.cport,
                            ip_delta: r.ip_delta_rev,
                            l4_delta: csum::negate(r.l4_delta),
                            smac,
                            dmac: r.peer_mac,
                        }
                    };
                    nat::<A>(pkt.buf, pkt.head, l3, tcp, to).then_some(r.in_port)
                }
                Dir::Forward => {
                    // The IP packet's length: the fast parser found it inside the frame.
                    let inner = A::HEADER_LEN + usize::from(l.seg);
                    match l3 {
                        14 => dsr_at::<A, 14>(c, r, pkt, inner),
                        18 => dsr_at::<A, 18>(c, r, pkt, inner),
                        _ => None,
                    }
                }
            }
        }
    };
}

fast_stage!(
    /// Runs the lanes of one family; returns the bit mask of packets left for the slow path
    /// (misses, deferred hits) and how many packets it transmitted. Marks each lane that missed.
    stage,
    rewrite,
    shaped = false
);

fast_stage!(
    /// [`stage`] for a batch whose lanes are all TCP of one family behind an untagged Ethernet
    /// header (`Pipeline::batch_shaped`).
    stage_shaped,
    rewrite_shaped,
    shaped = true
);

/// Whether a packet of flow `r` whose flags have [`flow_flags::DEFERRED`] or
/// [`flow_flags::MTU_CHECK`] may still be rewritten by the fast stage: not deferred, and its IP
/// packet (the header and `seg` bytes of transport segment) no larger than the MTU of the port
/// it leaves on: the client's (`in_port`) for a reply, `out_port` for a forward packet (NAT
/// keeps the size; an encapsulating flow has no `MTU_CHECK`, [`dsr_at`] checks its own). A
/// larger packet goes to the slow path, which answers it (RFC 1191 / RFC 8201). Out of line
/// and cold: only flows between ports of different MTUs come here, and the established path
/// keeps its one test of the mask.
#[cold]
#[inline(never)]
fn fits<A: Fam>(c: &Common, dir: Dir, r: &Rec<A>, seg: u16) -> bool {
    if r.flags & flow_flags::DEFERRED != 0 {
        return false;
    }
    let port = if dir == Dir::Reply { r.in_port } else { r.out_port };
    A::HEADER_LEN + usize::from(seg) <= usize::from(c.port_mtu(port))
}

/// What the NAT rewrite writes into a forward packet of flow `r`: the reply tuple's mirror
/// (`reply_dst`, `backend_addr` and their ports), the forward deltas, the out port's MAC and
/// the next hop's.
#[inline(always)]
fn forward_nat<A: Fam>(c: &Common, r: &Rec<A>) -> Nat<A> {
    Nat {
        src: r.reply_dst,
        dst: r.backend_addr,
        sport: r.reply_dport,
        dport: r.bport,
        ip_delta: r.ip_delta_fwd,
        l4_delta: r.l4_delta,
        smac: c.port_mac(r.out_port),
        dmac: r.hop_mac,
    }
}

/// Whether a parsed packet has the fast parser's shape (TCP or UDP, not fragmented, right after
/// an IP header without options or extension headers at offset 14 or 18), so the precomputed
/// rewrite of its flow's record applies.
#[inline]
pub(super) fn shaped<A: Family>(p: &Parsed) -> bool {
    matches!(p.proto, proto::TCP | proto::UDP)
        && p.frag == Frag::None
        && matches!(p.l3, 14 | 18)
        && p.l4 == p.l3 + A::HEADER_LEN
}

/// The forward NAT rewrite of record `r` for a [`shaped`] packet of the slow path; `None`,
/// frame untouched, if the TTL would expire.
#[inline]
pub(super) fn nat_forward<A: Fam>(c: &Common, r: &Rec<A>, pkt: &mut Packet<'_>, p: &Parsed) -> Option<Verdict> {
    #[expect(clippy::cast_possible_truncation, reason = "14 or 18 (shaped)")]
    let l3 = p.l3 as u8;
    nat_forward_at(c, r, pkt.frame_mut(), 0, l3, p.proto == proto::TCP)
}

/// [`nat_forward`] for a fast-parsed packet of the slow path: the rewrite takes the headers
/// from the frame's head in the packet's buffer (the fast parser found them inside the
/// frame), the IP header at `l3` (14 or 18), the transport TCP (`tcp`) or UDP.
#[inline]
pub(super) fn nat_forward_lane<A: Fam>(
    c: &Common,
    r: &Rec<A>,
    pkt: &mut Packet<'_>,
    l3: u8,
    tcp: bool,
) -> Option<Verdict> {
    nat_forward_at(c, r, pkt.buf, pkt.head, l3, tcp)
}

/// The forward NAT rewrite of record `r` into the frame at offset `head` of `buf`, IP header
/// at `l3` from there.
#[inline(always)]
fn nat_forward_at<A: Fam>(c: &Common, r: &Rec<A>, buf: &mut [u8], head: usize, l3: u8, tcp: bool) -> Option<Verdict> {
    let to = |_: &[u8]| forward_nat(c, r);
    nat::<A>(buf, head, l3, tcp, to).then_some(Verdict::Tx { port: r.out_port })
}

/// What a NAT rewrite writes.
struct Nat<A> {
    src: A,
    dst: A,
    sport: u16,
    dport: u16,
    /// IPv4 header checksum delta, TTL decrement included, in wire order ([`csum::wire`]).
    ip_delta: u16,
    /// Transport checksum delta, in wire order.
    l4_delta: u16,
    smac: [u8; 6],
    dmac: [u8; 6],
}

/// The NAT rewrite at the fast parser's offsets: picks the instance for the IP header offset
/// and the transport protocol. The frame starts at `head` in `buf`; the rewrite writes only
/// its headers, which the fast parser found inside the frame, so it needs no view that ends
/// with the frame. `to` gives what to write (from the frame's headers, checked); it is called
/// only once the frame passed its checks. Returns `false`, frame untouched, if the TTL would
/// expire or the headers do not fit in `buf`.
#[inline(always)]
fn nat<A: Family>(buf: &mut [u8], head: usize, l3: u8, tcp: bool, to: impl FnOnce(&[u8]) -> Nat<A>) -> bool {
    match (l3, tcp) {
        (14, true) => nat_at::<A, 14, true>(buf, head, to),
        (14, false) => nat_at::<A, 14, false>(buf, head, to),
        (18, true) => nat_at::<A, 18, true>(buf, head, to),
        (18, false) => nat_at::<A, 18, false>(buf, head, to),
        _ => false,
    }
}

/// Writes MACs, source and destination address and port, decrements the TTL / hop limit and
/// applies the precomputed IPv4 header delta (TTL decrement included) and transport delta
/// (RFC 1624), both in wire order to the checksum fields read in the machine's (no byte swap,
/// [`csum::wire`]); UDP over IPv4 keeps a zero checksum zero (RFC 768). `L3` is the IP header
/// offset from the frame's first byte, at `head` in `buf`; `TCP` the transport protocol
/// (else UDP). One range check covers every byte written: `head..head + l4 + 18` (TCP's
/// checksum) or `+ 8` (UDP's header); a `head` so large that the end wraps fails it too.
#[inline(always)]
fn nat_at<A: Family, const L3: usize, const TCP: bool>(
    buf: &mut [u8],
    head: usize,
    to: impl FnOnce(&[u8]) -> Nat<A>,
) -> bool {
    let l4 = L3 + A::HEADER_LEN;
    let Some(h) = buf.get_mut(head..head.wrapping_add(l4 + if TCP { 18 } else { 8 })) else { return false };
    let ttl = L3 + A::TTL_OFF;
    if h.get(ttl).is_none_or(|t| *t <= 1) {
        return false;
    }
    let n = &to(h);
    emit::set_macs(h, n.smac, n.dmac);
    if let Some(s) = h.get_mut(L3 + A::SRC_OFF..L3 + A::SRC_OFF + A::LEN) {
        s.copy_from_slice(n.src.octets());
    }
    if let Some(s) = h.get_mut(L3 + A::DST_OFF..L3 + A::DST_OFF + A::LEN) {
        s.copy_from_slice(n.dst.octets());
    }
    if let Some(t) = h.get_mut(ttl) {
        *t = t.wrapping_sub(1);
    }
    if !A::IS_V6 {
        let sum = L3 + emit::ipv4::CHECKSUM.start;
        emit::put_u16_ne(h, sum, csum::apply_delta(emit::get_u16_ne(h, sum), n.ip_delta));
    }
    emit::put_u16(h, l4 + emit::tcp::SPORT.start, n.sport);
    emit::put_u16(h, l4 + emit::tcp::DPORT.start, n.dport);
    let at = l4 + if TCP { emit::tcp::CHECKSUM.start } else { emit::udp::CHECKSUM.start };
    let kind = if TCP {
        L4Sum::Always
    } else if A::IS_V6 {
        L4Sum::UdpV6
    } else {
        L4Sum::UdpV4
    };
    emit::put_u16_ne(h, at, csum::apply_l4_delta(kind, emit::get_u16_ne(h, at), n.l4_delta));
    true
}

/// DSR of a fast-parsed packet whose IP header is at the constant `L3` (14, or 18 behind an
/// 802.1Q tag) and whose IP packet is `inner` bytes long: the MACs rewritten and the TTL /
/// hop limit decremented (the IPv4 checksum with it, [`csum::TTL_DEC_WIRE`]), and for an
/// [`flow_flags::ENCAP`] flow the IP packet encapsulated in an IPIP (RFC 2003) or IP6IP6
/// (RFC 2473) header from `reply_dst` (the outer source) to the backend, written as
/// [`crate::nat::encap_at`] writes it (TOS / traffic class and DF copied from the inner header, TTL
/// 64, the flow hash as the IPv6 flow label, RFC 6438), any Ethernet padding left behind.
/// The frame grows into the buffer's headroom when it has at least the outer header's
/// length (the link-layer header moves down, the IP packet stays: the AF_XDP workers' frames
/// have the kernel's 256 bytes in front), else into its tailroom (the IP packet moves up).
/// Returns the out port. Every check is made before the first write: `None`, frame
/// untouched, when the slow path must act (TTL about to expire, the encapsulated packet over
/// the out port's MTU, no room for the outer header).
#[inline(always)]
fn dsr_at<A: Fam, const L3: usize>(c: &Common, r: &Rec<A>, pkt: &mut Packet<'_>, inner: usize) -> Option<u8> {
    let head = pkt.head;
    if r.flags & flow_flags::ENCAP == 0 {
        let f = pkt.buf.get_mut(head..head.wrapping_add(L3 + A::HEADER_LEN))?;
        let h = f.get_mut(L3..)?;
        if h.get(A::TTL_OFF).is_none_or(|t| *t <= 1) {
            return None;
        }
        dec_ttl::<A>(h, 0);
        emit::set_macs(f, c.port_mac(r.out_port), r.hop_mac);
        return Some(r.out_port);
    }
    let add = A::HEADER_LEN;
    let mtu = c.port_mtu(r.out_port);
    if mtu > 0 && inner + add > usize::from(mtu) {
        return None; // the slow path answers with "fragmentation needed" / "too big"
    }
    let total = L3 + add + inner;
    // The frame after encapsulation, and where the inner IP header is in it before the move.
    let (new_head, at) = if head >= add { (head - add, L3 + add) } else { (head, L3) };
    let f = pkt.buf.get_mut(new_head..new_head.wrapping_add(total))?;
    if f.get(at + A::TTL_OFF).is_none_or(|t| *t <= 1) {
        return None;
    }
    let ih = f.get_mut(at..at + A::HEADER_LEN)?;
    dec_ttl::<A>(ih, 0);
    let tos =
        if A::IS_V6 { emit::get_u8(ih, 0) << 4 | emit::get_u8(ih, 1) >> 4 } else { emit::get_u8(ih, emit::ipv4::TOS) };
    let dont_frag = !A::IS_V6 && emit::ipv4_dont_frag(ih);
    if head >= add {
        // The link-layer header's bytes after the MACs (the tag, the EtherType) move down;
        // the outer header then overwrites where the link-layer header was.
        let (to, from) = f.split_at_mut(add);
        if let (Some(d), Some(s)) = (to.get_mut(12..L3), from.get(12..L3)) {
            d.copy_from_slice(s);
        }
    } else {
        f.copy_within(L3..L3 + inner, L3 + add);
    }
    let ip = emit::IpHeader {
        src: r.reply_dst,
        dst: r.backend_addr,
        proto: if A::IS_V6 { proto::IPV6 } else { proto::IPIP },
        payload_len: inner,
        hop_limit: 64,
        tos,
        dont_frag,
        flow_label: slow::flow_hash_of(r),
    };
    if !emit::emit_ip(f.get_mut(L3..)?, &ip) {
        return None;
    }
    emit::set_macs(f, c.port_mac(r.out_port), r.hop_mac);
    (pkt.head, pkt.len) = (new_head, total);
    Some(r.out_port)
}

/// TTL / hop limit decrement with the IPv4 header checksum update (the caller checked TTL > 1).
#[inline]
fn dec_ttl<A: Family>(f: &mut [u8], l3: usize) {
    let Some(h) = f.get_mut(l3..l3 + A::HEADER_LEN) else { return };
    if let Some(t) = h.get_mut(A::TTL_OFF) {
        *t = t.wrapping_sub(1);
    }
    if !A::IS_V6 {
        let sum = emit::ipv4::CHECKSUM.start;
        emit::put_u16_ne(h, sum, csum::apply_delta(emit::get_u16_ne(h, sum), csum::TTL_DEC_WIRE));
    }
}
