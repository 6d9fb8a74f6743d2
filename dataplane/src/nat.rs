//! Packet rewrites: addresses, ports, TTL, MACs (NAT), and IPIP / IP6IP6 encapsulation and
//! MAC-only forwarding (DSR).
//!
//! All checksum changes are incremental (RFC 1624 eqn. 3, [`crate::csum`]): an address change
//! updates the IPv4 header checksum and the L4 checksum through the pseudo-header; a port
//! change updates the L4 checksum; SCTP's CRC32c is recomputed when ports change (RFC 9260
//! §6.8; it does not cover addresses). A UDP/IPv4 zero checksum stays zero (RFC 768).
//! Later fragments carry no L4 header, so only the IP header changes.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use crate::addr::Family;
use crate::csum::{self, L4Sum};
use crate::wire::emit::{self, IpHeader};
use crate::wire::{self, Frag, Parsed, proto};

/// A frame inside a larger buffer: `buf[head..head + len]` is the frame; bytes before `head`
/// are headroom for encapsulation, bytes after are tailroom for generated replies.
#[derive(Debug)]
pub struct Packet<'a> {
    /// The whole buffer (a UMEM frame, or a test vector).
    pub buf: &'a mut [u8],
    /// Offset of the frame's first byte (destination MAC).
    pub head: usize,
    /// Frame length in bytes.
    pub len: usize,
}

impl<'a> Packet<'a> {
    /// A packet whose frame fills `buf[head..head + len]`; `head + len` is clamped to the
    /// buffer so the view is always valid.
    pub fn new(buf: &'a mut [u8], head: usize, len: usize) -> Self {
        let head = head.min(buf.len());
        let len = len.min(buf.len() - head);
        Self { buf, head, len }
    }

    /// The frame bytes.
    #[inline]
    pub fn frame(&self) -> &[u8] {
        self.buf.get(self.head..self.head + self.len).unwrap_or(&[])
    }

    /// The frame bytes, mutable.
    #[inline]
    pub fn frame_mut(&mut self) -> &mut [u8] {
        let (h, l) = (self.head, self.len);
        self.buf.get_mut(h..h + l).unwrap_or(&mut [])
    }

    /// Bytes available after the frame.
    #[inline]
    pub fn tailroom(&self) -> usize {
        self.buf.len() - self.head - self.len
    }
}

/// Which L4 checksum rule applies to this packet, and where the field is (offset from the
/// L4 header), if any.
#[inline]
pub fn l4_sum<A: Family>(p: &Parsed) -> (L4Sum, usize) {
    if matches!(p.frag, Frag::Later { .. }) {
        return (L4Sum::None, 0);
    }
    match p.proto {
        proto::TCP => (L4Sum::Always, 16),
        proto::UDP if A::IS_V6 => (L4Sum::UdpV6, 6),
        proto::UDP => (L4Sum::UdpV4, 6),
        proto::ICMPV6 => (L4Sum::Always, 2),
        _ => (L4Sum::None, 0),
    }
}

/// Reads the source address.
#[inline]
pub fn src<A: Family>(f: &[u8], p: &Parsed) -> A {
    f.get(p.l3 + A::SRC_OFF..).and_then(A::from_slice).unwrap_or(A::UNSPECIFIED)
}

/// Reads the destination address.
#[inline]
pub fn dst<A: Family>(f: &[u8], p: &Parsed) -> A {
    f.get(p.l3 + A::DST_OFF..).and_then(A::from_slice).unwrap_or(A::UNSPECIFIED)
}

/// Rewrites the address at `off` in the IP header at `p.l3` (source or destination) and
/// fixes the IPv4 header checksum and the L4 checksum.
#[inline]
fn set_addr<A: Family>(f: &mut [u8], p: &Parsed, off: usize, new: A) {
    let at = p.l3 + off;
    let Some(slot) = f.get(at..at + A::LEN) else { return };
    let old = A::from_slice(slot).unwrap_or(A::UNSPECIFIED);
    if old == new {
        return;
    }
    if let Some(s) = f.get_mut(at..at + A::LEN) {
        s.copy_from_slice(new.octets());
    }
    if !A::IS_V6
        && let Some(hc) = wire::read_u16(f, p.l3 + 10)
    {
        wire::write_u16(f, p.l3 + 10, csum::update_bytes(hc, old.octets(), new.octets()));
    }
    let (kind, sum_at) = l4_sum::<A>(p);
    if kind != L4Sum::None {
        let at = p.l4 + sum_at;
        if let Some(hc) = wire::read_u16(f, at) {
            wire::write_u16(f, at, csum::update_l4(kind, hc, old.octets(), new.octets()));
        }
    }
}

/// Rewrites the source address (SNAT, reply un-DNAT).
#[inline]
pub fn set_src<A: Family>(f: &mut [u8], p: &Parsed, new: A) {
    set_addr(f, p, A::SRC_OFF, new);
}

/// Rewrites the destination address (DNAT, reply un-SNAT).
#[inline]
pub fn set_dst<A: Family>(f: &mut [u8], p: &Parsed, new: A) {
    set_addr(f, p, A::DST_OFF, new);
}

/// Rewrites the source (`which = 0`) or destination (`which = 2`) port of TCP/UDP/SCTP.
#[inline]
fn set_port<A: Family>(f: &mut [u8], p: &Parsed, which: usize, new: u16) {
    if matches!(p.frag, Frag::Later { .. }) {
        return;
    }
    let at = p.l4 + which;
    let Some(old) = wire::read_u16(f, at) else { return };
    if old == new {
        return;
    }
    wire::write_u16(f, at, new);
    match p.proto {
        proto::SCTP if p.frag == Frag::None => {
            if let Some(seg) = f.get_mut(p.l4..p.end) {
                csum::sctp_crc_update_ports(seg);
            }
        }
        proto::TCP | proto::UDP => {
            let (kind, sum_at) = l4_sum::<A>(p);
            let at = p.l4 + sum_at;
            if let Some(hc) = wire::read_u16(f, at) {
                wire::write_u16(f, at, csum::update_l4(kind, hc, &old.to_be_bytes(), &new.to_be_bytes()));
            }
        }
        _ => {}
    }
}

/// Rewrites the source port.
#[inline]
pub fn set_sport<A: Family>(f: &mut [u8], p: &Parsed, new: u16) {
    set_port::<A>(f, p, 0, new);
}

/// Rewrites the destination port.
#[inline]
pub fn set_dport<A: Family>(f: &mut [u8], p: &Parsed, new: u16) {
    set_port::<A>(f, p, 2, new);
}

/// Decrements TTL / hop limit (RFC 791 §3.2; RFC 8200 §3) with an incremental IPv4 header
/// checksum update. Returns `false`, changing nothing, if the packet must not be forwarded
/// (TTL ≤ 1).
#[inline]
pub fn dec_ttl<A: Family>(f: &mut [u8], p: &Parsed) -> bool {
    let at = p.l3 + A::TTL_OFF;
    let Some(&ttl) = f.get(at) else { return false };
    if ttl <= 1 {
        return false;
    }
    if let Some(b) = f.get_mut(at) {
        *b = ttl - 1;
    }
    if !A::IS_V6 {
        // TTL is the high byte of the 16-bit word at offset 8 (TTL, protocol).
        let pr = f.get(p.l3 + 9).copied().unwrap_or(0);
        if let Some(hc) = wire::read_u16(f, p.l3 + 10) {
            let old = u16::from_be_bytes([ttl, pr]);
            let new = u16::from_be_bytes([ttl - 1, pr]);
            wire::write_u16(f, p.l3 + 10, csum::update16(hc, old, new));
        }
    }
    true
}

/// Writes the Ethernet addresses ([`emit::set_macs`]).
#[inline]
pub fn set_macs(f: &mut [u8], src: [u8; 6], dst: [u8; 6]) {
    emit::set_macs(f, src, dst);
}

/// Bytes an encapsulation header adds: 20 (IPIP, RFC 2003) or 40 (IP6IP6, RFC 2473).
#[inline]
pub const fn encap_overhead<A: Family>() -> usize {
    A::HEADER_LEN
}

/// Encapsulates the IP packet in a new outer header of the same family (IPIP, RFC 2003 §3.1;
/// IPv6-in-IPv6, RFC 2473 §5), moving the Ethernet header (and VLAN tag) into the headroom.
/// The outer header copies the inner TOS / traffic class and, for IPv4, the DF bit; TTL /
/// hop limit 64; IPv6 flow label from `flow_hash` (RFC 6438) so the backend's RSS spreads.
/// `p` is invalid afterwards (offsets moved); the caller re-parses if needed.
///
/// Returns `false`, changing nothing, if there is neither headroom nor tailroom for it.
pub fn encap<A: Family>(pkt: &mut Packet<'_>, p: &Parsed, outer_src: A, outer_dst: A, flow_hash: u32) -> bool {
    encap_at(pkt, p.l3, p.end, outer_src, outer_dst, flow_hash)
}

/// [`encap`] of the IP packet at `l3..end` of the frame (the EtherType field is at `l3 - 2`).
pub fn encap_at<A: Family>(
    pkt: &mut Packet<'_>,
    l3: usize,
    end: usize,
    outer_src: A,
    outer_dst: A,
    flow_hash: u32,
) -> bool {
    let add = A::HEADER_LEN;
    let Some(inner_len) = end.checked_sub(l3) else { return false };
    let l2 = l3; // Ethernet (+ tag) length
    if l2 < 2 || pkt.head + end > pkt.buf.len() {
        return false;
    }
    if pkt.head >= add {
        // Move the L2 header down into the headroom (XDP `bpf_xdp_adjust_head` style).
        let new_head = pkt.head - add;
        pkt.buf.copy_within(pkt.head..pkt.head + l2, new_head);
        pkt.head = new_head;
    } else if pkt.buf.len() >= pkt.head + l2 + inner_len + add {
        // No headroom (a frame at the start of its buffer): move the IP packet up instead.
        // Costs a copy of the packet; see docs/benchmarks.md.
        let from = pkt.head + l2;
        pkt.buf.copy_within(from..from + inner_len, from + add);
    } else {
        return false;
    }
    pkt.len = l2 + add + inner_len;
    let f = pkt.frame_mut();
    let Some((outer, inner)) = f.get_mut(l2..).map(|x| x.split_at_mut(add.min(x.len()))) else { return false };
    // The outer header copies the inner TOS / traffic class and, for IPv4, the DF bit.
    let tos = if A::IS_V6 {
        (emit::get_u8(inner, 0) << 4) | (emit::get_u8(inner, 1) >> 4)
    } else {
        emit::get_u8(inner, emit::ipv4::TOS)
    };
    let ip = IpHeader {
        src: outer_src,
        dst: outer_dst,
        proto: if A::IS_V6 { proto::IPV6 } else { proto::IPIP },
        payload_len: inner_len,
        hop_limit: 64,
        tos,
        dont_frag: !A::IS_V6 && emit::ipv4_dont_frag(inner),
        flow_label: flow_hash,
    };
    if !emit::emit_ip(outer, &ip) {
        return false;
    }
    emit::set_ethertype(f, l3 - 2, A::ETHERTYPE);
    true
}

/// Picks an outer source address from `prefix` (host bits from `hash`), so each flow gets
/// its own outer source and the backend's RSS spreads flows (Katran `create_encap_ipv4_src`).
pub fn outer_source<A: Family>(prefix: &crate::addr::Cidr, hash: u32) -> A {
    let n = A::LEN;
    let net = crate::addr::mapped(prefix.addr);
    let net = net.get(16 - n..).unwrap_or(&[]);
    let bits = u32::from(prefix.len).min(u32::try_from(n * 8).unwrap_or(128));
    // The hash fills the last 4 bytes; earlier host bytes stay zero.
    let mut host = [0u8; 16];
    if let Some(t) = host.get_mut(n - 4..n) {
        t.copy_from_slice(&hash.to_be_bytes());
    }
    let mut b = [0u8; 16];
    for (i, ((out, net), hb)) in b.iter_mut().zip(net).zip(host).enumerate() {
        let bit0 = u32::try_from(i * 8).unwrap_or(u32::MAX);
        let mask: u8 = if bit0 + 8 <= bits {
            0xff
        } else if bit0 >= bits {
            0
        } else {
            0xffu8 << (8 - (bits - bit0))
        };
        *out = (net & mask) | (hb & !mask);
    }
    b.get(..n).and_then(A::from_slice).unwrap_or(A::UNSPECIFIED)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;
    use crate::addr::{V4, V6};
    use crate::build::{self, Frame};
    use proptest::prelude::*;

    fn parsed(f: &[u8]) -> Parsed {
        wire::parse(f).unwrap().unwrap()
    }

    proptest! {
        #[test]
        fn nat_rewrites_keep_checksums_valid_v4(src in any::<[u8;4]>(), dst in any::<[u8;4]>(),
            sp in 1u16.., dp in 1u16.., nd in any::<[u8;4]>(), ns in any::<[u8;4]>(), np in 1u16..,
            udp in any::<bool>(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut f = if udp { Frame::udp_v4(src, sp, dst, dp, &payload) } else {
                Frame::ip(src.into(), dst.into(), proto::TCP, &build::tcp_segment(sp, dp, 0x18, 7, 9, &payload), &build::IpOpts::default())
            };
            let p = parsed(&f.bytes);
            set_dst::<V4>(&mut f.bytes, &p, V4(nd));
            set_dport::<V4>(&mut f.bytes, &p, np);
            set_src::<V4>(&mut f.bytes, &p, V4(ns));
            set_sport::<V4>(&mut f.bytes, &p, np ^ 0x5555);
            prop_assert!(dec_ttl::<V4>(&mut f.bytes, &p));
            prop_assert_eq!(build::verify(&f.bytes), Ok(()));
        }

        #[test]
        fn nat_rewrites_keep_checksums_valid_v6(src in any::<[u8;16]>(), dst in any::<[u8;16]>(),
            sp in 1u16.., dp in 1u16.., nd in any::<[u8;16]>(), np in 1u16..,
            udp in any::<bool>(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut f = if udp { Frame::udp_v6(src, sp, dst, dp, &payload) } else { Frame::tcp_v6(src, sp, dst, dp, 0x10) };
            let p = parsed(&f.bytes);
            set_dst::<V6>(&mut f.bytes, &p, V6(nd));
            set_dport::<V6>(&mut f.bytes, &p, np);
            prop_assert!(dec_ttl::<V6>(&mut f.bytes, &p));
            prop_assert_eq!(build::verify(&f.bytes), Ok(()));
        }
    }

    /// RFC 768: a UDP/IPv4 checksum that computes to zero is sent as `0xffff`, since a zero
    /// field means "no checksum". The random rewrites above reach that sum about once in
    /// 65,536 cases and `build::verify` accepts a zero field, so they cannot tell; this
    /// rewrite is chosen to reach it: with the new port `hc + old` (one's complement),
    /// `~hc + ~old + new` is minus zero.
    #[test]
    fn udp_v4_rewrite_to_a_computed_zero_checksum_sends_0xffff() {
        let mut f = Frame::udp_v4([10, 0, 0, 1], 40_000, [10, 96, 0, 1], 53, b"q");
        let p = parsed(&f.bytes);
        let hc = u16::from_be_bytes([f.bytes[p.l4 + 6], f.bytes[p.l4 + 7]]);
        assert!(hc != 0 && hc != 0xffff, "a checksummed datagram ({hc:#x})");
        let (sum, carry) = hc.overflowing_add(53);
        set_dport::<V4>(&mut f.bytes, &p, sum + u16::from(carry));
        assert_eq!(&f.bytes[p.l4 + 6..p.l4 + 8], &[0xff, 0xff], "not 0: that would switch the checksum off");
        assert_eq!(build::verify(&f.bytes), Ok(()));
        // The same sum over IPv6 (no zero rule) is written as computed.
        assert_eq!(
            csum::update_l4(csum::L4Sum::Always, hc, &53u16.to_be_bytes(), &(sum + u16::from(carry)).to_be_bytes()),
            0
        );
    }

    #[test]
    fn udp_v4_zero_checksum_is_kept_zero_through_dnat() {
        let mut f = Frame::udp_v4([10, 0, 0, 1], 5, [10, 96, 0, 1], 53, b"q");
        let p = parsed(&f.bytes);
        f.bytes[p.l4 + 6..p.l4 + 8].fill(0);
        set_dst::<V4>(&mut f.bytes, &p, V4([10, 1, 1, 1]));
        set_dport::<V4>(&mut f.bytes, &p, 5353);
        assert_eq!(&f.bytes[p.l4 + 6..p.l4 + 8], &[0, 0]);
    }

    #[test]
    fn ipip_encap_moves_l2_into_headroom_and_builds_valid_outer_header() {
        let f = Frame::tcp_v4([10, 0, 0, 1], 5, [10, 96, 0, 1], 80, 0x02);
        let mut buf = vec![0xa5u8; 64 + f.bytes.len() + 64];
        buf[64..64 + f.bytes.len()].copy_from_slice(&f.bytes);
        let mut pkt = Packet::new(&mut buf, 64, f.bytes.len());
        let p = parsed(pkt.frame());
        assert!(encap::<V4>(&mut pkt, &p, V4([172, 16, 0, 9]), V4([10, 0, 1, 1]), 7));
        assert_eq!(pkt.head, 44);
        let out = pkt.frame().to_vec();
        assert_eq!(out.len(), f.bytes.len() + 20);
        assert_eq!(&out[..12], &f.bytes[..12]);
        assert_eq!(out[14 + 9], proto::IPIP);
        assert_eq!(&out[34..], &f.bytes[14..]);
        assert_eq!(build::verify(&out), Ok(()));
    }

    #[test]
    fn encap_without_headroom_or_tailroom_changes_nothing() {
        let mut f = Frame::tcp_v6([1; 16], 5, [2; 16], 80, 0x02);
        let orig = f.bytes.clone();
        let n = f.bytes.len();
        let mut pkt = Packet::new(&mut f.bytes, 0, n);
        let p = parsed(pkt.frame());
        assert!(!encap::<V6>(&mut pkt, &p, V6([3; 16]), V6([4; 16]), 1));
        assert_eq!(pkt.frame(), &orig[..]);
    }

    #[test]
    fn encap_without_headroom_uses_tailroom_and_gives_the_same_frame() {
        let f = Frame::tcp_v6([1; 16], 5, [2; 16], 80, 0x02);
        let mut a = vec![0u8; 64 + f.bytes.len() + 64];
        a[64..64 + f.bytes.len()].copy_from_slice(&f.bytes);
        let mut b = vec![0u8; f.bytes.len() + 64];
        b[..f.bytes.len()].copy_from_slice(&f.bytes);
        let mut pa = Packet::new(&mut a, 64, f.bytes.len());
        let mut pb = Packet::new(&mut b, 0, f.bytes.len());
        let p = parsed(pa.frame());
        assert!(encap::<V6>(&mut pa, &p, V6([3; 16]), V6([4; 16]), 9));
        assert!(encap::<V6>(&mut pb, &p, V6([3; 16]), V6([4; 16]), 9));
        assert_eq!(pa.frame(), pb.frame());
        assert_eq!(pb.head, 0);
    }

    #[test]
    fn outer_source_keeps_the_prefix_and_varies_host_bits() {
        let c: crate::addr::Cidr = "172.16.0.0/16".parse().unwrap();
        let a: V4 = outer_source(&c, 0xdead_beef);
        assert_eq!(a, V4([172, 16, 0xbe, 0xef]));
        let c6: crate::addr::Cidr = "fd00:1::/64".parse().unwrap();
        let b: V6 = outer_source(&c6, 0x0102_0304);
        assert_eq!(&b.0[..8], &[0xfd, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(&b.0[12..], &[1, 2, 3, 4]);
    }
}
