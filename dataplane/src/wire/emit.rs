//! Header emitters: every header byte the pipeline writes, at one place, by field.
//!
//! In the style of smoltcp's `wire` (`Repr::emit`, `mod field`): each header has a table of
//! field ranges, and a function writes a whole header, or one field, into a buffer it checks
//! once. Nothing here panics; a buffer too short for the header is left untouched and the
//! function says so (`false`). The callers are the rewrites of [`crate::nat`], the generated
//! replies of [`crate::icmp`] and the per-packet rewrites of [`crate::process`].

use crate::addr::Family;
use crate::csum;

use super::proto;

/// Byte ranges of the Ethernet header (IEEE 802.3 §3.1.1).
pub mod eth {
    /// Destination MAC.
    pub const DST: core::ops::Range<usize> = 0..6;
    /// Source MAC.
    pub const SRC: core::ops::Range<usize> = 6..12;
}

/// Byte ranges of the IPv4 header (RFC 791 §3.1), relative to its start.
pub mod ipv4 {
    /// Version and IHL.
    pub const VER_IHL: usize = 0;
    /// Type of service (DSCP and ECN, RFC 2474 / RFC 3168).
    pub const TOS: usize = 1;
    /// Total length.
    pub const LEN: core::ops::Range<usize> = 2..4;
    /// Flags and fragment offset; the DF bit is 0x40 of the first byte.
    pub const FLAGS: usize = 6;
    /// Don't Fragment bit in the [`FLAGS`] byte.
    pub const DF: u8 = 0x40;
    /// TTL.
    pub const TTL: usize = 8;
    /// Protocol.
    pub const PROTO: usize = 9;
    /// Header checksum.
    pub const CHECKSUM: core::ops::Range<usize> = 10..12;
    /// Source address.
    pub const SRC: core::ops::Range<usize> = 12..16;
    /// Destination address.
    pub const DST: core::ops::Range<usize> = 16..20;
}

/// Byte ranges of the IPv6 header (RFC 8200 §3), relative to its start.
pub mod ipv6 {
    /// Version, traffic class and flow label.
    pub const VER_TC_FLOW: core::ops::Range<usize> = 0..4;
    /// Payload length.
    pub const LEN: core::ops::Range<usize> = 4..6;
    /// Next header.
    pub const NEXT: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC: core::ops::Range<usize> = 8..24;
    /// Destination address.
    pub const DST: core::ops::Range<usize> = 24..40;
}

/// Byte ranges of the TCP header (RFC 9293 §3.1), relative to its start.
pub mod tcp {
    /// Source port.
    pub const SPORT: core::ops::Range<usize> = 0..2;
    /// Destination port.
    pub const DPORT: core::ops::Range<usize> = 2..4;
    /// Sequence number.
    pub const SEQ: core::ops::Range<usize> = 4..8;
    /// Acknowledgment number.
    pub const ACK: core::ops::Range<usize> = 8..12;
    /// Data offset (high nibble).
    pub const DATA_OFF: usize = 12;
    /// Flags.
    pub const FLAGS: usize = 13;
    /// Checksum.
    pub const CHECKSUM: core::ops::Range<usize> = 16..18;
    /// Length of a header without options.
    pub const HEADER_LEN: usize = 20;
}

/// Byte ranges of the UDP header (RFC 768), relative to its start.
pub mod udp {
    /// Source port.
    pub const SPORT: core::ops::Range<usize> = 0..2;
    /// Destination port.
    pub const DPORT: core::ops::Range<usize> = 2..4;
    /// Checksum (0: none, IPv4 only).
    pub const CHECKSUM: core::ops::Range<usize> = 6..8;
}

/// Byte ranges of an ICMP / ICMPv6 message header (RFC 792, RFC 4443 §2.1).
pub mod icmp {
    /// Type.
    pub const TYPE: usize = 0;
    /// Code.
    pub const CODE: usize = 1;
    /// Checksum.
    pub const CHECKSUM: core::ops::Range<usize> = 2..4;
    /// The 4 bytes after the checksum (unused, or the next-hop MTU).
    pub const REST: core::ops::Range<usize> = 4..8;
    /// Length of the header.
    pub const HEADER_LEN: usize = 8;
}

/// Writes `v` big-endian into `range` of `b` (nothing if out of bounds).
#[inline]
pub fn put(b: &mut [u8], range: core::ops::Range<usize>, v: &[u8]) {
    if let Some(s) = b.get_mut(range)
        && s.len() == v.len()
    {
        s.copy_from_slice(v);
    }
}

/// Writes one byte at `at` (nothing if out of bounds).
#[inline]
pub fn put_u8(b: &mut [u8], at: usize, v: u8) {
    if let Some(x) = b.get_mut(at) {
        *x = v;
    }
}

/// Reads one byte at `at` (0 if out of bounds).
#[inline]
pub fn get_u8(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

/// The two bytes at `at` (zeros if out of bounds).
#[inline]
fn get2(b: &[u8], at: usize) -> [u8; 2] {
    match b.get(at..at + 2) {
        Some(&[x, y]) => [x, y],
        _ => [0; 2],
    }
}

/// Writes two bytes at `at` (nothing if out of bounds).
#[inline]
fn put2(b: &mut [u8], at: usize, v: [u8; 2]) {
    if let Some(s) = b.get_mut(at..at + 2) {
        s.copy_from_slice(&v);
    }
}

/// Reads a big-endian 16-bit field at `at` (0 if out of bounds).
#[inline]
pub fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(get2(b, at))
}

/// Writes a big-endian 16-bit field at `at` (nothing if out of bounds).
#[inline]
pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
    put2(b, at, v.to_be_bytes());
}

/// Reads the 16-bit field at `at` in the machine's byte order (0 if out of bounds): a checksum
/// field to be updated with a delta in wire order ([`crate::csum::wire`]), which RFC
/// 1071 §2(B) lets one add in either byte order.
#[inline]
pub fn get_u16_ne(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes(get2(b, at))
}

/// Writes a 16-bit field read with [`get_u16_ne`] back (nothing if out of bounds).
#[inline]
pub fn put_u16_ne(b: &mut [u8], at: usize, v: u16) {
    put2(b, at, v.to_ne_bytes());
}

/// Writes the Ethernet source and destination addresses.
#[inline]
pub fn set_macs(f: &mut [u8], src: [u8; 6], dst: [u8; 6]) {
    if let Some(h) = f.get_mut(..12) {
        let (d, s) = h.split_at_mut(6);
        d.copy_from_slice(&dst);
        s.copy_from_slice(&src);
    }
}

/// Swaps the Ethernet source and destination addresses (a reply to the sender).
#[inline]
pub fn swap_macs(f: &mut [u8]) {
    if let Some(h) = f.get_mut(..12) {
        let (d, s) = h.split_at_mut(6);
        d.swap_with_slice(s);
    }
}

/// The destination MAC of a frame (zeros if it is shorter than that).
#[inline]
pub fn dst_mac(f: &[u8]) -> [u8; 6] {
    f.get(eth::DST).and_then(|s| s.try_into().ok()).unwrap_or_default()
}

/// The source MAC of a frame (zeros if it is shorter than that).
#[inline]
pub fn src_mac(f: &[u8]) -> [u8; 6] {
    f.get(eth::SRC).and_then(|s| s.try_into().ok()).unwrap_or_default()
}

/// Whether the IPv4 header at the start of `h` has Don't Fragment set (RFC 791 §3.1).
#[inline]
pub fn ipv4_dont_frag(h: &[u8]) -> bool {
    get_u8(h, ipv4::FLAGS) & ipv4::DF != 0
}

/// The IP header fields xlb writes from scratch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IpHeader<A> {
    /// Source address.
    pub src: A,
    /// Destination address.
    pub dst: A,
    /// Protocol / next header.
    pub proto: u8,
    /// Bytes after the header (the IPv4 total length adds the 20 bytes of the header).
    pub payload_len: usize,
    /// TTL / hop limit.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub tos: u8,
    /// IPv4 Don't Fragment (ignored for IPv6).
    pub dont_frag: bool,
    /// IPv6 flow label, low 20 bits (RFC 6438; ignored for IPv4).
    pub flow_label: u32,
}

/// Writes a fresh IP header of family `A` at the start of `h`: IPv4 without options (RFC 791
/// §3.1; identification 0, no fragment offset, checksum computed) or IPv6 without extension
/// headers (RFC 8200 §3). Every byte of the header is written, so `h` need not be cleared
/// first. The IPv4 checksum is the RFC 1071 sum of the header's words taken from the fields
/// rather than read back from the bytes (the header of a DSR packet's encapsulation is
/// written per packet). Returns `false`, writing nothing, if `h` is shorter than
/// `A::HEADER_LEN`. Always inlined: the fast path's DSR writes it at a constant offset,
/// where the bounds checks fold away.
#[inline(always)]
pub fn emit_ip<A: Family>(h: &mut [u8], ip: &IpHeader<A>) -> bool {
    let Some(h) = h.get_mut(..A::HEADER_LEN) else { return false };
    let len = |extra: usize| u16::try_from(ip.payload_len + extra).unwrap_or(u16::MAX);
    if A::IS_V6 {
        let w0 = 6u32 << 28 | u32::from(ip.tos) << 20 | (ip.flow_label & 0x000f_ffff);
        put(h, ipv6::VER_TC_FLOW, &w0.to_be_bytes());
        put_u16(h, ipv6::LEN.start, len(0));
        put_u8(h, ipv6::NEXT, ip.proto);
        put_u8(h, ipv6::HOP_LIMIT, ip.hop_limit);
        put(h, ipv6::SRC, ip.src.octets());
        put(h, ipv6::DST, ip.dst.octets());
    } else {
        let total = len(20);
        let flags = if ip.dont_frag { ipv4::DF } else { 0 };
        let [l0, l1] = total.to_be_bytes();
        // Version and IHL, TOS, total length, identification 0, flags, fragment offset 0,
        // TTL, protocol: the ten bytes before the checksum.
        put(h, 0..ipv4::CHECKSUM.start, &[0x45, ip.tos, l0, l1, 0, 0, flags, 0, ip.hop_limit, ip.proto]);
        put(h, ipv4::SRC, ip.src.octets());
        put(h, ipv4::DST, ip.dst.octets());
        // The words summed as the machine reads them and the checksum stored the same way:
        // RFC 1071 §2(B), the sum is the same bytes in either order.
        let ne = |a: u8, b: u8| u32::from(u16::from_ne_bytes([a, b]));
        let words = ne(0x45, ip.tos) + ne(l0, l1) + ne(flags, 0) + ne(ip.hop_limit, ip.proto);
        let sum = words + words_ne(ip.src.octets()) + words_ne(ip.dst.octets());
        put_u16_ne(h, ipv4::CHECKSUM.start, !csum::fold(sum));
    }
    true
}

/// The sum of the two 16-bit words of an IPv4 address as the machine reads them (0 for a
/// slice shorter than 4 bytes).
#[inline(always)]
fn words_ne(a: &[u8]) -> u32 {
    a.first_chunk::<4>().map_or(0, |w| {
        let x = u32::from_ne_bytes(*w);
        (x & 0xffff) + (x >> 16)
    })
}

/// Writes an ICMP / ICMPv6 header at the start of `m`: type, code, a zero checksum (the caller
/// computes it over the message) and the 4 bytes after it. Returns `false`, writing nothing, if
/// `m` is shorter than 8 bytes.
pub fn emit_icmp(m: &mut [u8], ty: u8, code: u8, rest: [u8; 4]) -> bool {
    let Some(m) = m.get_mut(..icmp::HEADER_LEN) else { return false };
    put_u8(m, icmp::TYPE, ty);
    put_u8(m, icmp::CODE, code);
    put(m, icmp::CHECKSUM, &[0, 0]);
    put(m, icmp::REST, &rest);
    true
}

/// The TCP header fields of a segment without options or payload (a RST).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TcpHeader {
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flags ([`super::tcp_flags`]).
    pub flags: u8,
}

/// Writes a 20-byte TCP header (RFC 9293 §3.1; window 0, no options) at the start of `t` with
/// the checksum over the pseudo-header of `src` → `dst` (RFC 9293 §3.1). Returns `false`,
/// writing nothing, if `t` is shorter than 20 bytes.
pub fn emit_tcp<A: Family>(t: &mut [u8], src: A, dst: A, h: &TcpHeader) -> bool {
    let Some(t) = t.get_mut(..tcp::HEADER_LEN) else { return false };
    t.fill(0);
    put(t, tcp::SPORT, &h.sport.to_be_bytes());
    put(t, tcp::DPORT, &h.dport.to_be_bytes());
    put(t, tcp::SEQ, &h.seq.to_be_bytes());
    put(t, tcp::ACK, &h.ack.to_be_bytes());
    put_u8(t, tcp::DATA_OFF, 5 << 4);
    put_u8(t, tcp::FLAGS, h.flags);
    let len = u32::try_from(tcp::HEADER_LEN).unwrap_or(20);
    let sum = csum::add_bytes(csum::pseudo_header(src.octets(), dst.octets(), proto::TCP, len), t);
    put(t, tcp::CHECKSUM, &(!csum::fold(sum)).to_be_bytes());
    true
}

/// Sets the EtherType field at `at` (12, or 16 behind a VLAN tag).
#[inline]
pub fn set_ethertype(f: &mut [u8], at: usize, et: u16) {
    put(f, at..at + 2, &et.to_be_bytes());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
    use super::*;
    use crate::addr::{V4, V6};

    fn ip<A: Family>(src: A, dst: A) -> IpHeader<A> {
        IpHeader {
            src,
            dst,
            proto: proto::UDP,
            payload_len: 8,
            hop_limit: 64,
            tos: 0x28,
            dont_frag: true,
            flow_label: 0x12345,
        }
    }

    #[test]
    fn emitted_ipv4_header_parses_back_with_a_valid_checksum() {
        let mut b = [0xa5u8; 28];
        assert!(emit_ip(&mut b, &ip(V4([10, 0, 0, 1]), V4([10, 0, 0, 2]))));
        let p = smoltcp::wire::Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!((p.total_len(), p.hop_limit(), p.dont_frag(), p.dscp() << 2 | p.ecn()), (28, 64, true, 0x28));
        assert_eq!(b[20..], [0xa5; 8], "nothing written past the header");
    }

    proptest::proptest! {
        /// The checksum taken from the fields is the checksum of the header's bytes, and every
        /// byte is written whatever the buffer held (the model: the header laid out by RFC 791
        /// §3.1 in a zeroed buffer, then summed).
        #[test]
        fn an_emitted_ipv4_header_is_its_fields_with_the_checksum_of_its_bytes(
            src: [u8; 4], dst: [u8; 4], proto: u8, payload_len in 0usize..70_000, hop_limit: u8,
            tos: u8, dont_frag: bool, junk: u8,
        ) {
            let mut b = [junk; 20];
            let ip = IpHeader { src: V4(src), dst: V4(dst), proto, payload_len, hop_limit, tos, dont_frag, flow_label: 0 };
            proptest::prop_assert!(emit_ip(&mut b, &ip));
            let mut m = [0u8; 20];
            m[0] = 0x45;
            m[1] = tos;
            m[2..4].copy_from_slice(&u16::try_from(payload_len + 20).unwrap_or(u16::MAX).to_be_bytes());
            m[6] = if dont_frag { 0x40 } else { 0 };
            m[8] = hop_limit;
            m[9] = proto;
            m[12..16].copy_from_slice(&src);
            m[16..20].copy_from_slice(&dst);
            let c = csum::checksum(&m);
            m[10..12].copy_from_slice(&c.to_be_bytes());
            proptest::prop_assert_eq!(b, m);
        }
    }

    #[test]
    fn emitted_ipv6_header_carries_class_and_flow_label() {
        let mut b = [0xa5u8; 48];
        assert!(emit_ip(&mut b, &ip(V6([1; 16]), V6([2; 16]))));
        let p = smoltcp::wire::Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.payload_len(), p.traffic_class(), p.flow_label()), (8, 0x28, 0x12345));
    }

    #[test]
    fn short_buffers_are_left_alone() {
        let mut b = [7u8; 19];
        assert!(!emit_ip(&mut b, &ip(V4([1; 4]), V4([2; 4]))));
        assert!(!emit_icmp(&mut b[..7], 3, 3, [0; 4]));
        assert!(!emit_tcp(&mut b, V4([1; 4]), V4([2; 4]), &TcpHeader { sport: 1, dport: 2, seq: 3, ack: 4, flags: 4 }));
        assert_eq!(b, [7; 19]);
        let mut f = [1u8, 2, 3];
        swap_macs(&mut f);
        set_macs(&mut f, [9; 6], [9; 6]);
        assert_eq!(f, [1, 2, 3]);
    }

    #[test]
    fn swap_macs_exchanges_source_and_destination() {
        let mut f = [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 8];
        swap_macs(&mut f);
        assert_eq!(f, [2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 8]);
        assert_eq!((dst_mac(&f), src_mac(&f)), ([2; 6], [1; 6]));
    }
}
