//! Generated replies (ICMP errors, TCP RST) and helpers for translating received ICMP errors.
//!
//! Replies are built **in place** in the received frame: the original IP packet is moved
//! forward to become the quoted datagram, and fresh headers are written in front of it, so
//! no buffer is allocated. The quote is as long as fits in 576 bytes (IPv4, RFC 1812 §4.3.2.3)
//! or 1280 bytes (IPv6, RFC 4443 §2.4(c)) and in the buffer's tailroom.
//!
//! Checksums of generated headers are computed in full (they are new headers, tens of
//! bytes); the checksum of a translated ICMP error is recomputed over the message because the
//! quoted datagram changes in several places (addresses, ports, the quoted checksums), after
//! the received checksum is verified ([`checksum_ok`]).

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use crate::addr::Family;
use crate::csum;
use crate::nat::Packet;
use crate::wire::emit::{self, IpHeader, TcpHeader};
use crate::wire::{self, Parsed, proto, tcp_flags};

/// ICMPv4 destination unreachable (RFC 792).
pub const V4_UNREACH: u8 = 3;
/// ICMPv4 code: port unreachable.
pub const V4_PORT_UNREACH: u8 = 3;
/// ICMPv4 code: fragmentation needed and DF set (RFC 1191).
pub const V4_FRAG_NEEDED: u8 = 4;
/// ICMPv6 destination unreachable (RFC 4443 §3.1).
pub const V6_UNREACH: u8 = 1;
/// ICMPv6 code: port unreachable.
pub const V6_PORT_UNREACH: u8 = 4;
/// ICMPv6 packet too big (RFC 4443 §3.2).
pub const V6_TOO_BIG: u8 = 2;
/// ICMPv4 time exceeded (RFC 792); code 0: time to live exceeded in transit.
pub const V4_TIME_EXCEEDED: u8 = 11;
/// ICMPv6 time exceeded (RFC 4443 §3.3); code 0: hop limit exceeded in transit.
pub const V6_TIME_EXCEEDED: u8 = 3;

/// Writes a fresh IP header of family `A` at `l3` (no options, no extension headers): TTL 64,
/// TOS 0, DF clear, as a host's stack answers.
fn write_ip<A: Family>(f: &mut [u8], l3: usize, src: A, dst: A, l4_proto: u8, l4_len: usize) {
    if let Some(h) = f.get_mut(l3..) {
        let ip = IpHeader {
            src,
            dst,
            proto: l4_proto,
            payload_len: l4_len,
            hop_limit: 64,
            tos: 0,
            dont_frag: false,
            flow_label: 0,
        };
        emit::emit_ip(h, &ip);
    }
}

/// The one's complement sum of the ICMP (IPv4) or ICMPv6 (with pseudo-header, RFC 4443 §2.3)
/// message at `l4..end`, for the addresses currently in the IP header at `l3`, as it stands
/// (checksum field included); `None` if the offsets are outside the frame.
fn message_sum<A: Family>(f: &[u8], l3: usize, l4: usize, end: usize) -> Option<u32> {
    let src = f.get(l3 + A::SRC_OFF..).and_then(A::from_slice)?;
    let dst = f.get(l3 + A::DST_OFF..).and_then(A::from_slice)?;
    let msg = f.get(l4..end)?;
    Some(if A::IS_V6 {
        let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
        csum::add_bytes(csum::pseudo_header(src.octets(), dst.octets(), proto::ICMPV6, len), msg)
    } else {
        csum::add_bytes(0, msg)
    })
}

/// Whether the ICMP or ICMPv6 checksum of the message at `l4..end` verifies (RFC 1071 §1: the
/// sum over the message with its checksum is all ones). A received error is checked before it
/// is translated, since the translation writes a checksum computed afresh
/// ([`refresh_icmp_checksum`]), which would make a corrupted error look sound (IPVS
/// `ip_vs_in_icmp` and netfilter's `icmp_error` drop such errors too).
pub fn checksum_ok<A: Family>(f: &[u8], l3: usize, l4: usize, end: usize) -> bool {
    message_sum::<A>(f, l3, l4, end).is_some_and(|s| csum::fold(s) == 0xffff)
}

/// Recomputes the ICMP (IPv4) or ICMPv6 (with pseudo-header, RFC 4443 §2.3) checksum of the
/// message at `l4..end`, for the addresses currently in the IP header at `l3`.
pub fn refresh_icmp_checksum<A: Family>(f: &mut [u8], l3: usize, l4: usize, end: usize) {
    if end < l4 + 4 {
        return;
    }
    let Some(msg) = f.get_mut(l4..end) else { return };
    emit::put(msg, emit::icmp::CHECKSUM, &[0, 0]);
    let Some(sum) = message_sum::<A>(f, l3, l4, end) else { return };
    if let Some(msg) = f.get_mut(l4..end) {
        emit::put(msg, emit::icmp::CHECKSUM, &(!csum::fold(sum)).to_be_bytes());
    }
}

/// Whether an ICMP error may answer the packet (RFC 1122 §3.2.2, RFC 1812 §4.3.2.7, RFC 4443
/// §2.4(e)): not if it came as a link-layer broadcast or multicast (the group bit of its
/// destination MAC), nor if its source names no single host: the unspecified address, "this
/// network" (0/8) and loopback, multicast, and for IPv4 class E and the limited broadcast.
/// Otherwise a spoofed source would make xlb answer a whole group. Nor, over IPv4, if it is a
/// fragment other than the first (RFC 1812 §4.3.2.7; ICMPv6 has no such rule, and a Packet
/// Too Big about any fragment is what path MTU discovery needs, RFC 8201).
pub fn may_answer<A: Family>(f: &[u8], p: &Parsed) -> bool {
    if f.first().is_none_or(|mac0| mac0 & 1 != 0) {
        return false;
    }
    if !A::IS_V6 && matches!(p.frag, crate::wire::Frag::Later { .. }) {
        return false;
    }
    let src: A = crate::nat::src(f, p);
    match src.octets() {
        // ::/127: unspecified and loopback (RFC 4291 §2.5.2, §2.5.3); ff00::/8 multicast.
        [0xff, ..] => false,
        o if A::IS_V6 => !matches!(o, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 | 1]),
        // 0/8, 127/8, 224/4 multicast, 240/4 class E with 255.255.255.255 (RFC 1122 §3.2.1.3).
        o => !matches!(o, [0 | 127 | 224..=255, ..] | []),
    }
}

/// Turns the packet into an ICMP error of `ty`/`code` (with `rest`, the 4 bytes after the
/// checksum: zero, or the next-hop MTU) sent back to its source, from its destination,
/// quoting the original. The Ethernet addresses are swapped; VLAN tag kept.
///
/// Returns `false`, changing nothing, if no error may answer the packet ([`may_answer`]) or
/// the buffer cannot hold the reply with at least the original IP header plus 8 bytes quoted.
pub fn error_in_place<A: Family>(pkt: &mut Packet<'_>, p: &Parsed, ty: u8, code: u8, rest: [u8; 4]) -> bool {
    let f = pkt.frame();
    if !may_answer::<A>(f, p) {
        return false;
    }
    let src: A = crate::nat::dst(f, p);
    let dst: A = crate::nat::src(f, p);
    let l3 = p.l3;
    let hdr = A::HEADER_LEN;
    let shift = hdr + 8;
    let max_quote = if A::IS_V6 { 1280 - 48 } else { 576 - 28 };
    let room = pkt.buf.len().saturating_sub(pkt.head + l3 + shift);
    let q = (p.end - l3).min(max_quote).min(room);
    if q < (p.l4 - l3) + 8 {
        return false;
    }
    let from = pkt.head + l3;
    pkt.buf.copy_within(from..from + q, from + shift);
    pkt.len = l3 + shift + q;
    let f = pkt.frame_mut();
    let icmp_proto = if A::IS_V6 { proto::ICMPV6 } else { proto::ICMP };
    write_ip(f, l3, src, dst, icmp_proto, 8 + q);
    if let Some(m) = f.get_mut(l3 + hdr..) {
        emit::emit_icmp(m, ty, code, rest);
    }
    let end = l3 + shift + q;
    refresh_icmp_checksum::<A>(f, l3, l3 + hdr, end);
    emit::swap_macs(f);
    true
}

/// ICMP port unreachable (IPv4 3/3, IPv6 1/4) back to the sender: kube-proxy's REJECT for a
/// service without endpoints (seed REJ-03, REJ-04).
pub fn port_unreachable<A: Family>(pkt: &mut Packet<'_>, p: &Parsed) -> bool {
    if A::IS_V6 {
        error_in_place::<A>(pkt, p, V6_UNREACH, V6_PORT_UNREACH, [0; 4])
    } else {
        error_in_place::<A>(pkt, p, V4_UNREACH, V4_PORT_UNREACH, [0; 4])
    }
}

/// "Fragmentation needed" (RFC 1191 §4) or "packet too big" (RFC 4443 §3.2) carrying `mtu`.
pub fn too_big<A: Family>(pkt: &mut Packet<'_>, p: &Parsed, mtu: u16) -> bool {
    if A::IS_V6 {
        error_in_place::<A>(pkt, p, V6_TOO_BIG, 0, u32::from(mtu).to_be_bytes())
    } else {
        let m = mtu.to_be_bytes();
        error_in_place::<A>(pkt, p, V4_UNREACH, V4_FRAG_NEEDED, [0, 0, m[0], m[1]])
    }
}

/// "Time exceeded in transit" (RFC 792 type 11 code 0, RFC 4443 §3.3 type 3 code 0): what a
/// router sends back for a packet whose TTL / hop limit it cannot decrement (RFC 1812 §5.3.1).
pub fn time_exceeded<A: Family>(pkt: &mut Packet<'_>, p: &Parsed) -> bool {
    let ty = if A::IS_V6 { V6_TIME_EXCEEDED } else { V4_TIME_EXCEEDED };
    error_in_place::<A>(pkt, p, ty, 0, [0; 4])
}

/// Turns a TCP segment into the RST that RFC 9293 §3.10.7.1 prescribes for a segment that
/// belongs to no connection: if it carried an ACK, `<SEQ=SEG.ACK><CTL=RST>`; otherwise
/// `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`. Sent back to the client from the VIP, so the
/// client fails at once instead of waiting for a timeout. Never answers a RST.
pub fn tcp_reset_in_place<A: Family>(pkt: &mut Packet<'_>, p: &Parsed) -> bool {
    let f = pkt.frame();
    if p.proto != proto::TCP || p.tcp_flags & tcp_flags::RST != 0 {
        return false;
    }
    let Some(seg) = f.get(p.l4..p.end) else { return false };
    let &[_, _, _, _, s0, s1, s2, s3, a0, a1, a2, a3, off, ..] = seg else { return false };
    if seg.len() < emit::tcp::HEADER_LEN {
        return false;
    }
    let seq = u32::from_be_bytes([s0, s1, s2, s3]);
    let ack = u32::from_be_bytes([a0, a1, a2, a3]);
    let data_off = usize::from(off >> 4) * 4;
    let mut seg_len = u32::try_from(seg.len().saturating_sub(data_off)).unwrap_or(0);
    if p.tcp_flags & tcp_flags::SYN != 0 {
        seg_len += 1;
    }
    if p.tcp_flags & tcp_flags::FIN != 0 {
        seg_len += 1;
    }
    let (rseq, rack, rflags) = if p.tcp_flags & tcp_flags::ACK != 0 {
        (ack, 0, tcp_flags::RST)
    } else {
        (0, seq.wrapping_add(seg_len), tcp_flags::RST | tcp_flags::ACK)
    };
    let src: A = crate::nat::dst(f, p);
    let dst: A = crate::nat::src(f, p);
    let (sport, dport) = (p.dport, p.sport);
    let l3 = p.l3;
    let l4 = l3 + A::HEADER_LEN;
    let f = pkt.frame_mut();
    if f.len() < l4 + emit::tcp::HEADER_LEN {
        return false;
    }
    write_ip(f, l3, src, dst, proto::TCP, emit::tcp::HEADER_LEN);
    let Some(t) = f.get_mut(l4..) else { return false };
    emit::emit_tcp(t, src, dst, &TcpHeader { sport, dport, seq: rseq, ack: rack, flags: rflags });
    emit::swap_macs(f);
    pkt.len = l4 + emit::tcp::HEADER_LEN;
    true
}

/// The datagram quoted in an ICMP error, as a [`Parsed`] view whose offsets point inside the
/// outer frame, so the rewrite functions of [`crate::nat`] apply to it unchanged.
///
/// # Errors
/// `MalformedL4` if the quote is shorter than an IP header plus 8 bytes, or not TCP, UDP or
/// SCTP (other quoted protocols are not tracked).
pub fn quoted_view<A: Family>(f: &[u8], outer: &Parsed) -> Result<Parsed, crate::counters::DropReason> {
    let (l3, l4, pr) = wire::quoted(f, outer.l4 + 8, outer.end, A::IS_V6)?;
    if !matches!(pr, proto::TCP | proto::UDP | proto::SCTP) {
        return Err(crate::counters::DropReason::IcmpUntracked);
    }
    Ok(Parsed {
        ethertype_at: outer.ethertype_at,
        l3,
        l4,
        end: outer.end,
        proto: pr,
        sport: wire::read_u16(f, l4).unwrap_or(0),
        dport: wire::read_u16(f, l4 + 2).unwrap_or(0),
        tcp_flags: 0,
        icmp_type: 0,
        // Treated as a first fragment so SCTP's CRC (which needs the whole packet) is left
        // alone while TCP/UDP checksums present in the quote are still updated.
        frag: wire::Frag::First { id: 0 },
        frag_hdr: 0,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;
    use crate::addr::{V4, V6};
    use crate::build::{self, Frame};

    fn parsed(f: &[u8]) -> Parsed {
        wire::parse(f).unwrap().unwrap()
    }

    #[test]
    fn port_unreachable_quotes_the_original_and_goes_back_to_the_sender() {
        let f = Frame::udp_v4([10, 0, 0, 1], 5000, [10, 96, 0, 9], 53, b"query");
        let mut buf = vec![0u8; 2048];
        buf[..f.bytes.len()].copy_from_slice(&f.bytes);
        let mut pkt = Packet::new(&mut buf, 0, f.bytes.len());
        let p = parsed(pkt.frame());
        assert!(port_unreachable::<V4>(&mut pkt, &p));
        let out = pkt.frame().to_vec();
        assert_eq!(build::verify(&out), Ok(()));
        let q = parsed(&out);
        assert_eq!((q.proto, q.icmp_type), (proto::ICMP, 3));
        assert_eq!(&out[26..30], &[10, 96, 0, 9]);
        assert_eq!(&out[30..34], &[10, 0, 0, 1]);
        assert_eq!(&out[0..6], &build::CLIENT_MAC);
        assert_eq!(&out[42..], &f.bytes[14..], "quotes the whole original IP packet");
    }

    #[test]
    fn icmpv6_port_unreachable_has_a_valid_pseudo_header_checksum() {
        let f = Frame::tcp_v6([0xfd; 16], 5000, [0xfe; 16], 80, tcp_flags::SYN);
        let mut buf = vec![0u8; 2048];
        buf[..f.bytes.len()].copy_from_slice(&f.bytes);
        let mut pkt = Packet::new(&mut buf, 0, f.bytes.len());
        let p = parsed(pkt.frame());
        assert!(port_unreachable::<V6>(&mut pkt, &p));
        assert_eq!(build::verify(pkt.frame()), Ok(()));
    }

    #[test]
    fn no_tailroom_means_no_reply_and_no_change() {
        let mut f = Frame::udp_v4([10, 0, 0, 1], 5000, [10, 96, 0, 9], 53, b"query");
        let orig = f.bytes.clone();
        let n = f.bytes.len();
        let mut pkt = Packet::new(&mut f.bytes, 0, n);
        let p = parsed(pkt.frame());
        assert!(!port_unreachable::<V4>(&mut pkt, &p));
        assert_eq!(pkt.frame(), &orig[..]);
    }

    #[test]
    fn rst_answers_a_data_segment_with_seq_equal_to_its_ack() {
        let seg = build::tcp_segment(40000, 80, tcp_flags::ACK | tcp_flags::PSH, 111, 222, b"GET /");
        let f = Frame::ip([10, 0, 0, 1].into(), [10, 96, 0, 9].into(), proto::TCP, &seg, &build::IpOpts::default());
        let mut b = f.bytes.clone();
        let n = b.len();
        let mut pkt = Packet::new(&mut b, 0, n);
        let p = parsed(pkt.frame());
        assert!(tcp_reset_in_place::<V4>(&mut pkt, &p));
        let out = pkt.frame().to_vec();
        assert_eq!(build::verify(&out), Ok(()));
        let q = parsed(&out);
        assert_eq!((q.sport, q.dport, q.tcp_flags), (80, 40000, tcp_flags::RST));
        assert_eq!(&out[34 + 4..34 + 8], &222u32.to_be_bytes());
    }

    #[test]
    fn rst_is_never_sent_in_answer_to_a_rst() {
        let mut f = Frame::tcp_v4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2, tcp_flags::RST);
        let n = f.bytes.len();
        let mut pkt = Packet::new(&mut f.bytes, 0, n);
        let p = parsed(pkt.frame());
        assert!(!tcp_reset_in_place::<V4>(&mut pkt, &p));
    }
}
