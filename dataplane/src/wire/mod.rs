//! Header parsing over a frame in place, with `smoltcp::wire` views for validation.
//!
//! [`ethernet`], [`parse_v4`] and [`parse_v6`] validate the Ethernet header (one optional 802.1Q tag, IEEE 802.1Q §9), the IP
//! header (IPv4 with options, RFC 791; IPv6 with its extension-header chain, RFC 8200 §4) and
//! the L4 header (TCP, UDP, SCTP, ICMPv4, ICMPv6), and return offsets into the frame: no
//! copies and no allocation. Every offset in a returned [`Parsed`] is inside the frame, so
//! later stages can index without re-checking lengths beyond what is documented per field.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use smoltcp::wire::{EthernetFrame, Icmpv4Packet, Icmpv6Packet, Ipv4Packet, Ipv6Packet, TcpPacket, UdpPacket};

use crate::addr::{V4, V6};
use crate::counters::DropReason;

pub mod emit;

/// IP protocol numbers used by the pipeline (IANA "Assigned Internet Protocol Numbers").
pub mod proto {
    /// ICMP for IPv4 (RFC 792).
    pub const ICMP: u8 = 1;
    /// IPv4-in-IP encapsulation (RFC 2003).
    pub const IPIP: u8 = 4;
    /// TCP (RFC 9293).
    pub const TCP: u8 = 6;
    /// UDP (RFC 768).
    pub const UDP: u8 = 17;
    /// IPv6 encapsulation (RFC 2473).
    pub const IPV6: u8 = 41;
    /// IPv6 Hop-by-Hop options (RFC 8200 §4.3).
    pub const HOPOPT: u8 = 0;
    /// IPv6 Routing header (RFC 8200 §4.4).
    pub const ROUTING: u8 = 43;
    /// IPv6 Fragment header (RFC 8200 §4.5).
    pub const FRAGMENT: u8 = 44;
    /// Authentication Header (RFC 4302).
    pub const AH: u8 = 51;
    /// ICMPv6 (RFC 4443).
    pub const ICMPV6: u8 = 58;
    /// IPv6 Destination options (RFC 8200 §4.6).
    pub const DSTOPTS: u8 = 60;
    /// SCTP (RFC 9260).
    pub const SCTP: u8 = 132;
}

/// EtherType of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Length of an Ethernet header without a tag, in bytes.
pub const ETH_LEN: usize = 14;
/// Most IPv6 extension headers walked before giving up (a counted drop).
pub const MAX_EXT_HEADERS: usize = 8;

/// Fragment information of an IP packet.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Frag {
    /// Not a fragment.
    None,
    /// First fragment (offset 0, more fragments follow): carries the L4 header.
    First {
        /// IPv4 identification (16 bits) or IPv6 fragment identification (32 bits).
        id: u32,
    },
    /// A later fragment (offset > 0): no L4 header.
    Later {
        /// Identification.
        id: u32,
    },
}

/// What [`parse_v4`] / [`parse_v6`] found. All offsets are from the start of the frame, in bytes.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Parsed {
    /// Offset of the EtherType field that holds the IP EtherType (12, or 16 with a VLAN tag).
    pub ethertype_at: usize,
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the L4 header (or of the fragment payload for later fragments).
    pub l4: usize,
    /// End of the IP packet (`l3` + IP total length); Ethernet padding lies beyond.
    pub end: usize,
    /// L4 protocol after the extension headers; for a later IPv6 fragment, the Next Header of
    /// its Fragment header (the fragmentable part's first header).
    pub proto: u8,
    /// Source port (TCP/UDP/SCTP), ICMP identifier for echo, else 0.
    pub sport: u16,
    /// Destination port (TCP/UDP/SCTP), else 0.
    pub dport: u16,
    /// TCP flags byte (offset 13 of the TCP header), else 0.
    pub tcp_flags: u8,
    /// ICMP / ICMPv6 type, else 0.
    pub icmp_type: u8,
    /// Fragment state.
    pub frag: Frag,
    /// Offset of the IPv6 Fragment header (for re-encoding), 0 if none.
    pub frag_hdr: usize,
}

/// TCP flag bits (RFC 9293 §3.1).
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// The IP version of a frame, from its EtherType.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum L3 {
    /// IPv4 (EtherType 0x0800).
    V4,
    /// IPv6 (EtherType 0x86DD).
    V6,
    /// Anything else (ARP, LLDP, ...): the kernel's business.
    Other,
}

/// Reads the Ethernet header (and one 802.1Q tag): returns the family and the offset of the
/// EtherType field that names it.
///
/// # Errors
/// `MalformedL2` if the frame is shorter than its Ethernet header.
#[inline]
pub fn ethernet(frame: &[u8]) -> Result<(L3, usize), DropReason> {
    let eth = EthernetFrame::new_checked(frame).map_err(|_| DropReason::MalformedL2)?;
    let mut at = 12;
    let mut et = u16::from(eth.ethertype());
    if et == ETHERTYPE_VLAN {
        at = 16;
        et = read_u16(frame, at).ok_or(DropReason::MalformedL2)?;
    }
    let l3 = match et {
        0x0800 => L3::V4,
        0x86DD => L3::V6,
        _ => L3::Other,
    };
    Ok((l3, at))
}

/// Reads a big-endian u16 at `at`; `None` past the end.
#[inline]
pub fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    let s: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(u16::from_be_bytes(s))
}

/// Writes a big-endian u16 at `at`; does nothing past the end (callers only write inside
/// ranges [`parse_v4`] / [`parse_v6`] validated).
#[inline]
pub fn write_u16(b: &mut [u8], at: usize, v: u16) {
    if let Some(s) = b.get_mut(at..at + 2) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

/// Parses the IPv4 header at `l3` and the L4 header after it.
///
/// # Errors
/// `MalformedL3` / `MalformedL4` for truncated or inconsistent headers.
pub fn parse_v4(frame: &[u8], ethertype_at: usize) -> Result<Parsed, DropReason> {
    let l3 = ethertype_at + 2;
    let buf = frame.get(l3..).ok_or(DropReason::MalformedL3)?;
    let ip = Ipv4Packet::new_checked(buf).map_err(|_| DropReason::MalformedL3)?;
    if ip.version() != 4 {
        return Err(DropReason::MalformedL3);
    }
    let hl = usize::from(ip.header_len());
    let end = l3 + usize::from(ip.total_len());
    let more = ip.more_frags();
    let off = ip.frag_offset();
    let id = u32::from(ip.ident());
    let frag = if off > 0 {
        Frag::Later { id }
    } else if more {
        Frag::First { id }
    } else {
        Frag::None
    };
    let mut p = Parsed {
        ethertype_at,
        l3,
        l4: l3 + hl,
        end,
        proto: u8::from(ip.next_header()),
        sport: 0,
        dport: 0,
        tcp_flags: 0,
        icmp_type: 0,
        frag,
        frag_hdr: 0,
    };
    l4(frame, &mut p)?;
    Ok(p)
}

/// Parses the IPv6 header at `l3`, walks extension headers (Hop-by-Hop, Routing, Destination
/// options, Fragment, AH; at most [`MAX_EXT_HEADERS`]) and parses the L4 header.
///
/// # Errors
/// `MalformedL3` / `MalformedL4` for truncated or inconsistent headers.
pub fn parse_v6(frame: &[u8], ethertype_at: usize) -> Result<Parsed, DropReason> {
    let l3 = ethertype_at + 2;
    let buf = frame.get(l3..).ok_or(DropReason::MalformedL3)?;
    let ip = Ipv6Packet::new_checked(buf).map_err(|_| DropReason::MalformedL3)?;
    if ip.version() != 6 {
        return Err(DropReason::MalformedL3);
    }
    let end = l3 + 40 + usize::from(ip.payload_len());
    let mut next = u8::from(ip.next_header());
    let mut at = l3 + 40;
    let mut frag = Frag::None;
    let mut frag_hdr = 0;
    for _ in 0..MAX_EXT_HEADERS {
        let len = match next {
            proto::HOPOPT | proto::ROUTING | proto::DSTOPTS => {
                let l = frame.get(at + 1).ok_or(DropReason::MalformedL3)?;
                (usize::from(*l) + 1) * 8
            }
            proto::AH => {
                let l = frame.get(at + 1).ok_or(DropReason::MalformedL3)?;
                (usize::from(*l) + 2) * 4
            }
            proto::FRAGMENT => {
                let Some(&[_, _, o0, o1, i0, i1, i2, i3]) = frame.get(at..at + 8) else {
                    return Err(DropReason::MalformedL3);
                };
                let off_m = u16::from_be_bytes([o0, o1]);
                let id = u32::from_be_bytes([i0, i1, i2, i3]);
                frag = if off_m >> 3 != 0 {
                    Frag::Later { id }
                } else if off_m & 1 != 0 {
                    Frag::First { id }
                } else {
                    // An atomic fragment (RFC 6946): offset 0, M=0. Treat as whole.
                    Frag::None
                };
                frag_hdr = at;
                8
            }
            _ => break,
        };
        next = *frame.get(at).ok_or(DropReason::MalformedL3)?;
        at += len;
        if at > end {
            return Err(DropReason::MalformedL3);
        }
        if matches!(frag, Frag::Later { .. }) {
            // After a later fragment's Fragment header comes payload, not headers: its Next
            // Header names the first header of the fragmentable part (RFC 8200 §4.5), which
            // only the first fragment holds.
            break;
        }
    }
    if !matches!(frag, Frag::Later { .. })
        && matches!(next, proto::HOPOPT | proto::ROUTING | proto::DSTOPTS | proto::FRAGMENT | proto::AH)
    {
        return Err(DropReason::MalformedL3);
    }
    let mut p = Parsed {
        ethertype_at,
        l3,
        l4: at,
        end,
        proto: next,
        sport: 0,
        dport: 0,
        tcp_flags: 0,
        icmp_type: 0,
        frag,
        frag_hdr,
    };
    l4(frame, &mut p)?;
    Ok(p)
}

/// Validates and reads the L4 header in `frame[p.l4..p.end]`. Later fragments carry no L4
/// header and are left with zero ports.
fn l4(frame: &[u8], p: &mut Parsed) -> Result<(), DropReason> {
    if matches!(p.frag, Frag::Later { .. }) {
        return Ok(());
    }
    let seg = frame.get(p.l4..p.end).ok_or(DropReason::MalformedL3)?;
    match p.proto {
        proto::TCP => {
            let t = TcpPacket::new_checked(seg).map_err(|_| DropReason::MalformedL4)?;
            p.sport = t.src_port();
            p.dport = t.dst_port();
            p.tcp_flags = seg.get(13).copied().unwrap_or(0);
        }
        proto::UDP => {
            if p.frag == Frag::None {
                // Whole datagram: the length field must fit what is here (RFC 768).
                let u = UdpPacket::new_checked(seg).map_err(|_| DropReason::MalformedL4)?;
                if usize::from(u.len()) < 8 {
                    return Err(DropReason::MalformedL4);
                }
            } else if seg.len() < 8 {
                // A first fragment carries only part of the datagram.
                return Err(DropReason::MalformedL4);
            }
            p.sport = read_u16(seg, 0).unwrap_or(0);
            p.dport = read_u16(seg, 2).unwrap_or(0);
        }
        proto::SCTP => {
            // RFC 9260 §3.1 common header: ports, verification tag, checksum: 12 bytes.
            let &[s0, s1, d0, d1, _, _, _, _, _, _, _, _, ..] = seg else { return Err(DropReason::MalformedL4) };
            p.sport = u16::from_be_bytes([s0, s1]);
            p.dport = u16::from_be_bytes([d0, d1]);
        }
        proto::ICMP => {
            let i = Icmpv4Packet::new_checked(seg).map_err(|_| DropReason::MalformedL4)?;
            p.icmp_type = u8::from(i.msg_type());
            p.sport = read_u16(seg, 4).unwrap_or(0);
        }
        proto::ICMPV6 => {
            let i = Icmpv6Packet::new_checked(seg).map_err(|_| DropReason::MalformedL4)?;
            p.icmp_type = u8::from(i.msg_type());
            p.sport = read_u16(seg, 4).unwrap_or(0);
        }
        _ => {}
    }
    Ok(())
}

/// Parses a whole frame: Ethernet, then IPv4 or IPv6 and L4. `Ok(None)` for frames that are
/// not IP (ARP, LLDP, ...).
///
/// # Errors
/// As [`ethernet`], [`parse_v4`] and [`parse_v6`].
pub fn parse(frame: &[u8]) -> Result<Option<Parsed>, DropReason> {
    match ethernet(frame)? {
        (L3::V4, at) => parse_v4(frame, at).map(Some),
        (L3::V6, at) => parse_v6(frame, at).map(Some),
        (L3::Other, _) => Ok(None),
    }
}

/// A frame the fast parser took: where its IP header and packet end are, and its 5-tuple.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Fast<A> {
    /// Offset of the IP header: 14, or 18 behind an 802.1Q tag.
    pub l3: usize,
    /// End of the IP packet (`l3` + IP total length); Ethernet padding lies beyond.
    pub end: usize,
    /// [`proto::TCP`] or [`proto::UDP`].
    pub proto: u8,
    /// TCP flags byte (0 for UDP).
    pub tcp_flags: u8,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Source address.
    pub src: A,
    /// Destination address.
    pub dst: A,
}

/// [`Fast`] of either family.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum FastFrame {
    /// IPv4.
    V4(Fast<V4>),
    /// IPv6.
    V6(Fast<V6>),
}

/// The common case at fixed offsets: Ethernet with at most one 802.1Q tag, then IPv4 without
/// options and not fragmented (version/IHL byte `0x45`, MF = 0, offset 0) or IPv6 whose next
/// header is the L4 header (no extension header), then TCP or UDP. Returns `None` for every
/// other frame (the caller hands those to [`parse`]). Each shape is read at constant offsets
/// (instantiated per IP header offset), so a handful of bounds checks cover every field.
///
/// It performs the checks the full parser performs (smoltcp's `check_len` of each header, RFC
/// 791 total length, RFC 8200 payload length, the TCP data offset, the UDP length of RFC 768)
/// and may refuse more, so it never accepts a frame that [`parse`] rejects, and whatever it
/// accepts, [`parse`] reads the same: [`parse_fast`] gives the [`Parsed`] view of it, and
/// `tests::fast_parser_agrees_with_the_full_parser` and the `fast_parse` fuzz target check
/// that the two agree.
#[inline(always)]
pub fn parse_fast_frame(f: &[u8]) -> Option<FastFrame> {
    let e = f.get(..ETH_LEN)?;
    match u16::from_be_bytes([*e.get(12)?, *e.get(13)?]) {
        0x0800 => fast_v4::<ETH_LEN>(f).map(FastFrame::V4),
        0x86DD => fast_v6::<ETH_LEN>(f).map(FastFrame::V6),
        ETHERTYPE_VLAN => match read_u16(f, 16)? {
            0x0800 => fast_v4::<18>(f).map(FastFrame::V4),
            0x86DD => fast_v6::<18>(f).map(FastFrame::V6),
            _ => None,
        },
        _ => None,
    }
}

/// [`parse_fast_frame`] for the most common shape alone: IPv4 right behind an untagged
/// Ethernet header, carrying TCP. `Some` exactly when [`parse_fast_frame`] gives
/// [`FastFrame::V4`] with `l3` 14 and protocol TCP, and then the same value; `None` for every
/// other frame. One check of the frame's length covers every field it reads; the pipeline runs
/// a path of its own for batches of this shape (`process`). It repeats the checks of `fast_v4`
/// and `fast_l4` rather than calling them: calling `fast_v4` after checking the Ethernet type
/// and protocol measured 22 more instructions per established packet (callgrind,
/// `callgrind-pipeline batch established uniform 20000`); the differential tests below and the
/// `fast_parse` fuzz target keep the two in agreement.
#[inline(always)]
pub fn parse_fast_v4_tcp(f: &[u8]) -> Option<Fast<V4>> {
    // Offsets: Ethernet type 12, IPv4 header 14 (version/IHL 14, total length 16, flags and
    // fragment offset 20, protocol 23, addresses 26 and 30), TCP header 34 (ports 34 and 36,
    // data offset 46, flags 47).
    let h: &[u8; ETH_LEN + 20 + 20] = f.first_chunk()?;
    let (e0, e1, vihl, t0, t1, f0, f1, proto) = (h[12], h[13], h[14], h[16], h[17], h[20], h[21], h[23]);
    let (off, flags) = (h[46], h[47]);
    let total = usize::from(u16::from_be_bytes([t0, t1]));
    let data_off = usize::from(off >> 4) * 4;
    // The checks of `fast_v4` and `fast_l4`: IHL 5, not fragmented, the whole IP packet in the
    // frame, a TCP header of at least 20 bytes that fits in it.
    if [e0, e1] != [0x08, 0x00]
        || vihl != 0x45
        || (f0 & 0x3f) | f1 != 0
        || proto != proto::TCP
        || ETH_LEN + total > f.len()
        || total < 40
        || data_off < 20
        || data_off > total - 20
    {
        return None;
    }
    Some(Fast {
        l3: ETH_LEN,
        end: ETH_LEN + total,
        proto,
        tcp_flags: flags,
        sport: u16::from_be_bytes([h[34], h[35]]),
        dport: u16::from_be_bytes([h[36], h[37]]),
        src: V4([h[26], h[27], h[28], h[29]]),
        dst: V4([h[30], h[31], h[32], h[33]]),
    })
}

/// [`parse_fast_v4_tcp`] for IPv6: TCP right after an IPv6 header behind an untagged
/// Ethernet header. `Some` exactly when [`parse_fast_frame`] gives [`FastFrame::V6`] with `l3`
/// 14 and protocol TCP, and then the same value; `None` for every other frame. One check of
/// the frame's length covers every field it reads (the pipeline's path for batches of this
/// shape, `process`); the differential tests below and the `fast_parse` fuzz target keep it in
/// agreement with [`parse_fast_frame`].
#[inline(always)]
pub fn parse_fast_v6_tcp(f: &[u8]) -> Option<Fast<V6>> {
    // Offsets: Ethernet type 12, IPv6 header 14 (version 14, payload length 18, next header
    // 20, addresses 22 and 38), TCP header 54 (ports 54 and 56, data offset 66, flags 67).
    let h: &[u8; ETH_LEN + 40 + 20] = f.first_chunk()?;
    let (e0, e1, v, p0, p1, proto) = (h[12], h[13], h[14], h[18], h[19], h[20]);
    let (off, flags) = (h[66], h[67]);
    let seg = usize::from(u16::from_be_bytes([p0, p1]));
    let data_off = usize::from(off >> 4) * 4;
    // The checks of `fast_v6` and `fast_l4`: version 6, the whole IP packet in the frame, a
    // TCP header of at least 20 bytes that fits in it.
    if [e0, e1] != [0x86, 0xDD]
        || v >> 4 != 6
        || proto != proto::TCP
        || ETH_LEN + 40 + seg > f.len()
        || seg < 20
        || data_off < 20
        || data_off > seg
    {
        return None;
    }
    let addr = |at: usize| -> [u8; 16] { h.get(at..at + 16).and_then(|a| a.try_into().ok()).unwrap_or([0; 16]) };
    Some(Fast {
        l3: ETH_LEN,
        end: ETH_LEN + 40 + seg,
        proto,
        tcp_flags: flags,
        sport: u16::from_be_bytes([h[54], h[55]]),
        dport: u16::from_be_bytes([h[56], h[57]]),
        src: V6(addr(22)),
        dst: V6(addr(38)),
    })
}

/// IPv4 at offset `L3` (see [`parse_fast_frame`]).
#[inline(always)]
fn fast_v4<const L3: usize>(f: &[u8]) -> Option<Fast<V4>> {
    let h = f.get(..L3 + 20)?;
    let ip = h.get(L3..)?;
    let &[vihl, _, t0, t1, _, _, f0, f1, _, proto, ..] = ip else { return None };
    let total = usize::from(u16::from_be_bytes([t0, t1]));
    // IHL 5 (no options), not fragmented (MF = 0, offset 0; DF may be set), whole packet here.
    if vihl != 0x45 || (f0 & 0x3f) | f1 != 0 || L3 + total > f.len() {
        return None;
    }
    let src = V4(ip.get(12..16)?.try_into().ok()?);
    let dst = V4(ip.get(16..20)?.try_into().ok()?);
    let (sport, dport, tcp_flags) = fast_l4::<20>(f, L3, total, proto)?;
    Some(Fast { l3: L3, end: L3 + total, proto, tcp_flags, sport, dport, src, dst })
}

/// IPv6 at offset `L3` (see [`parse_fast_frame`]).
#[inline(always)]
fn fast_v6<const L3: usize>(f: &[u8]) -> Option<Fast<V6>> {
    let h = f.get(..L3 + 40)?;
    let ip = h.get(L3..)?;
    let &[v, _, _, _, p0, p1, proto, ..] = ip else { return None };
    let total = 40 + usize::from(u16::from_be_bytes([p0, p1]));
    if v >> 4 != 6 || L3 + total > f.len() {
        return None;
    }
    let src = V6(ip.get(8..24)?.try_into().ok()?);
    let dst = V6(ip.get(24..40)?.try_into().ok()?);
    let (sport, dport, tcp_flags) = fast_l4::<40>(f, L3, total, proto)?;
    Some(Fast { l3: L3, end: L3 + total, proto, tcp_flags, sport, dport, src, dst })
}

/// TCP or UDP right after an IP header of `HL` bytes at `l3`, in an IP packet of `total` bytes
/// that lies within `f`: ports and TCP flags.
#[inline(always)]
fn fast_l4<const HL: usize>(f: &[u8], l3: usize, total: usize, proto: u8) -> Option<(u16, u16, u8)> {
    let seg = total.checked_sub(HL)?;
    let l4 = f.get(l3 + HL..)?;
    match proto {
        proto::TCP => {
            let &[s0, s1, d0, d1, _, _, _, _, _, _, _, _, off, flags, ..] = l4 else { return None };
            let data_off = usize::from(off >> 4) * 4;
            if seg < 20 || data_off < 20 || data_off > seg {
                return None;
            }
            Some((u16::from_be_bytes([s0, s1]), u16::from_be_bytes([d0, d1]), flags))
        }
        proto::UDP => {
            let &[s0, s1, d0, d1, l0, l1, ..] = l4 else { return None };
            let len = usize::from(u16::from_be_bytes([l0, l1]));
            if seg < 8 || len < 8 || len > seg {
                return None;
            }
            Some((u16::from_be_bytes([s0, s1]), u16::from_be_bytes([d0, d1]), 0))
        }
        _ => None,
    }
}

/// [`parse_fast_frame`] as the full parser's [`Parsed`] view: `Some((family, parsed))` exactly
/// when the fast parser takes the frame, with the same value [`parse`] returns for it.
#[inline]
pub fn parse_fast(frame: &[u8]) -> Option<(L3, Parsed)> {
    let (l3, f, sport, dport, proto, tcp_flags) = match parse_fast_frame(frame)? {
        FastFrame::V4(x) => (L3::V4, (x.l3, x.end), x.sport, x.dport, x.proto, x.tcp_flags),
        FastFrame::V6(x) => (L3::V6, (x.l3, x.end), x.sport, x.dport, x.proto, x.tcp_flags),
    };
    let (at, end) = f;
    let hl = if l3 == L3::V4 { 20 } else { 40 };
    Some((
        l3,
        Parsed {
            ethertype_at: at - 2,
            l3: at,
            l4: at + hl,
            end,
            proto,
            sport,
            dport,
            tcp_flags,
            icmp_type: 0,
            frag: Frag::None,
            frag_hdr: 0,
        },
    ))
}

/// ICMPv4 error types that quote an offending datagram (RFC 792): destination unreachable,
/// time exceeded, parameter problem.
#[inline]
pub fn is_icmpv4_error(t: u8) -> bool {
    matches!(t, 3 | 11 | 12)
}

/// ICMPv6 error types (RFC 4443 §3): destination unreachable, packet too big, time exceeded,
/// parameter problem.
#[inline]
pub fn is_icmpv6_error(t: u8) -> bool {
    matches!(t, 1..=4)
}

/// Parses the datagram quoted inside an ICMP error (starting at `at`, the inner IP header),
/// which is usually truncated: only the IP header and the first 8 bytes of L4 (the ports)
/// are required (RFC 792, RFC 4443 §2.4(c)). Returns (inner l3, inner l4, inner proto).
///
/// # Errors
/// `MalformedL4` if the quote is too short for the IP header plus 8 bytes; `IcmpUntracked` if
/// it is an IPv4 later fragment.
pub fn quoted(frame: &[u8], at: usize, end: usize, v6: bool) -> Result<(usize, usize, u8), DropReason> {
    let q = frame.get(at..end).ok_or(DropReason::MalformedL4)?;
    let &[first, _, _, _, _, _, next, _, _, pr, ..] = q else { return Err(DropReason::MalformedL4) };
    if v6 {
        if q.len() < 48 || first >> 4 != 6 {
            return Err(DropReason::MalformedL4);
        }
        // Quoted extension headers are rare; only the plain header is supported here.
        Ok((at, at + 40, next))
    } else {
        let hl = usize::from(first & 0x0f) * 4;
        if first >> 4 != 4 || hl < 20 || q.len() < hl + 8 {
            return Err(DropReason::MalformedL4);
        }
        // A quoted later fragment (offset > 0) carries data where the ports would be: no
        // transport header to read or rewrite (IPVS `ip_vs_in_icmp` skips it too).
        if read_u16(q, 6).is_none_or(|fo| fo & 0x1fff != 0) {
            return Err(DropReason::IcmpUntracked);
        }
        Ok((at, at + hl, pr))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;
    use crate::build;

    #[test]
    fn vlan_tagged_ipv4_tcp_parses_ports_behind_the_tag() {
        let mut f = build::Frame::tcp_v4([10, 0, 0, 1], 1234, [10, 96, 0, 1], 80, tcp_flags::SYN);
        f.vlan(42);
        let (l3, at) = ethernet(&f.bytes).unwrap();
        assert_eq!((l3, at), (L3::V4, 16));
        let p = parse_v4(&f.bytes, at).unwrap();
        assert_eq!((p.sport, p.dport, p.proto, p.tcp_flags), (1234, 80, proto::TCP, tcp_flags::SYN));
    }

    #[test]
    fn ipv4_options_move_the_l4_offset() {
        let f = build::Frame::udp_v4_opts([10, 0, 0, 1], 5, [10, 96, 0, 1], 53, 8);
        let p = parse_v4(&f.bytes, 12).unwrap();
        assert_eq!(p.l4, 14 + 28);
        assert_eq!(p.dport, 53);
    }

    #[test]
    fn ipv6_extension_headers_are_skipped_and_fragment_header_noted() {
        let f = build::Frame::udp_v6_with_ext([0xfd; 16], 7, [0xfe; 16], 53, true);
        let p = parse_v6(&f.bytes, 12).unwrap();
        assert_eq!(p.proto, proto::UDP);
        assert_eq!(p.dport, 53);
        assert!(matches!(p.frag, Frag::First { .. }));
        assert!(p.frag_hdr > 0);
    }

    /// Frames of every shape the fast parser must accept, and some it must leave to the full
    /// parser.
    fn shapes() -> Vec<Vec<u8>> {
        let mut v = vec![
            build::Frame::tcp_v4([10, 0, 0, 1], 1234, [10, 96, 0, 1], 80, tcp_flags::SYN).bytes,
            build::Frame::udp_v4([10, 0, 0, 1], 5, [10, 96, 0, 1], 53, b"q").bytes,
            build::Frame::tcp_v6([0xfd; 16], 7, [0xfe; 16], 443, tcp_flags::ACK).bytes,
            build::Frame::udp_v6([0xfd; 16], 7, [0xfe; 16], 53, b"abc").bytes,
            build::Frame::udp_v4_opts([10, 0, 0, 1], 5, [10, 96, 0, 1], 53, 8).bytes,
            build::Frame::udp_v6_with_ext([0xfd; 16], 7, [0xfe; 16], 53, false).bytes,
            build::Frame::udp_v6_with_ext([0xfd; 16], 7, [0xfe; 16], 53, true).bytes,
        ];
        let mut tagged = build::Frame::tcp_v4([10, 0, 0, 1], 1234, [10, 96, 0, 1], 80, tcp_flags::ACK);
        tagged.vlan(7);
        v.push(tagged.bytes);
        let mut tagged6 = build::Frame::udp_v6([0xfd; 16], 7, [0xfe; 16], 53, b"x");
        tagged6.vlan(9);
        v.push(tagged6.bytes);
        let mut padded = build::Frame::tcp_v4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2, tcp_flags::ACK).bytes;
        padded.resize(60, 0); // Ethernet minimum frame: padding after the IP packet
        v.push(padded);
        v
    }

    #[test]
    fn fast_parser_accepts_plain_tcp_and_udp_and_agrees_with_the_full_parser() {
        let frames = shapes();
        let accepted: Vec<bool> = frames.iter().map(|f| parse_fast(f).is_some()).collect();
        // Plain v4/v6 TCP/UDP with and without a tag and padding are taken; options and
        // extension headers are left to the full parser.
        assert_eq!(accepted, [true, true, true, true, false, false, false, true, true, true]);
        for f in &frames {
            if let Some((l3, p)) = parse_fast(f) {
                let (l3_full, _) = ethernet(f).unwrap();
                assert_eq!(l3, l3_full);
                assert_eq!(parse(f), Ok(Some(p)));
            }
        }
    }

    proptest::proptest! {
        /// Differential check: mutate one or two bytes of a frame the fast parser takes (any
        /// header field), or cut it short; wherever the fast parser still accepts, the full
        /// parser yields exactly the same result.
        #[test]
        fn fast_parser_agrees_with_the_full_parser(
            which in 0usize..10, at in 0usize..80, val in proptest::prelude::any::<u8>(),
            at2 in 0usize..80, val2 in proptest::prelude::any::<u8>(), cut in 0usize..100) {
            let mut f = shapes().swap_remove(which);
            if let Some(b) = f.get_mut(at) { *b = val; }
            if let Some(b) = f.get_mut(at2) { *b = val2; }
            if cut < f.len() && cut % 3 == 0 { f.truncate(cut); }
            if let Some((l3, p)) = parse_fast(&f) {
                proptest::prop_assert_eq!(ethernet(&f).map(|(l, _)| l), Ok(l3));
                proptest::prop_assert_eq!(parse(&f), Ok(Some(p)));
            }
            proptest::prop_assert_eq!(parse_fast_v4_tcp(&f), common_shape(&f));
            proptest::prop_assert_eq!(parse_fast_v6_tcp(&f), common_shape6(&f));
        }
    }

    /// What [`parse_fast_v6_tcp`] must give: [`parse_fast_frame`]'s IPv6 result when the IP
    /// header is at 14 and the protocol is TCP, else `None`.
    fn common_shape6(f: &[u8]) -> Option<Fast<V6>> {
        match parse_fast_frame(f) {
            Some(FastFrame::V6(x)) if x.l3 == ETH_LEN && x.proto == proto::TCP => Some(x),
            _ => None,
        }
    }

    #[test]
    fn the_ipv6_common_shape_parser_takes_untagged_ipv6_tcp_alone_and_agrees_with_the_fast_parser() {
        let mut frames = shapes();
        let mut tagged = build::Frame::tcp_v6([0xfd; 16], 7, [0xfe; 16], 443, tcp_flags::ACK);
        tagged.vlan(5);
        frames.push(tagged.bytes);
        let mut padded = build::Frame::tcp_v6([0xfd; 16], 7, [0xfe; 16], 443, tcp_flags::SYN).bytes;
        padded.resize(100, 0);
        frames.push(padded);
        let taken: Vec<bool> = frames.iter().map(|f| parse_fast_v6_tcp(f).is_some()).collect();
        let expect: Vec<bool> = frames.iter().map(|f| common_shape6(f).is_some()).collect();
        assert_eq!(taken, expect);
        assert_eq!(taken.iter().filter(|t| **t).count(), 2, "untagged IPv6 TCP, plain and padded: {taken:?}");
        for f in &frames {
            assert_eq!(parse_fast_v6_tcp(f), common_shape6(f));
            for cut in 0..f.len() {
                assert_eq!(parse_fast_v6_tcp(&f[..cut]), common_shape6(&f[..cut]), "cut at {cut}");
            }
        }
    }

    /// What [`parse_fast_v4_tcp`] must give: [`parse_fast_frame`]'s IPv4 result when the IP
    /// header is at 14 and the protocol is TCP, else `None`.
    fn common_shape(f: &[u8]) -> Option<Fast<V4>> {
        match parse_fast_frame(f) {
            Some(FastFrame::V4(x)) if x.l3 == ETH_LEN && x.proto == proto::TCP => Some(x),
            _ => None,
        }
    }

    #[test]
    fn the_common_shape_parser_takes_untagged_ipv4_tcp_alone_and_agrees_with_the_fast_parser() {
        let frames = shapes();
        let taken: Vec<bool> = frames.iter().map(|f| parse_fast_v4_tcp(f).is_some()).collect();
        let expect: Vec<bool> = frames.iter().map(|f| common_shape(f).is_some()).collect();
        assert_eq!(taken, expect);
        assert!(taken.iter().any(|t| *t) && taken.iter().any(|t| !*t), "{taken:?}");
        for f in &frames {
            assert_eq!(parse_fast_v4_tcp(f), common_shape(f));
            for cut in 0..f.len() {
                assert_eq!(parse_fast_v4_tcp(&f[..cut]), common_shape(&f[..cut]), "cut at {cut}");
            }
        }
    }

    #[test]
    fn truncated_headers_are_malformed_not_panics() {
        let f = build::Frame::tcp_v4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2, 0);
        for cut in 0..f.bytes.len() {
            let b = &f.bytes[..cut];
            if let Ok((L3::V4, at)) = ethernet(b) {
                assert!(parse_v4(b, at).is_err(), "cut at {cut} parsed");
            }
        }
    }
}
