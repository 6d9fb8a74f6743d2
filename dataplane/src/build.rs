//! Frame builders and a full checksum verifier, for tests, fixtures, benchmarks, fuzz seeds
//! and the packet generator. Not used on the per-packet path (these allocate).
//!
//! Frames are built with correct IPv4 header checksums (RFC 791), TCP/UDP checksums over the
//! pseudo-header (RFC 9293 §3.1, RFC 768, RFC 8200 §8.1), ICMPv6 checksums (RFC 4443 §2.3)
//! and SCTP CRC32c (RFC 9260 §6.8).

use std::net::IpAddr;

use crate::csum;
use crate::wire::{self, proto};

/// Default source MAC of built frames (a locally administered address).
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Default destination MAC of built frames (the load balancer's port).
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];

/// An Ethernet frame under construction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The frame bytes, from the destination MAC on.
    pub bytes: Vec<u8>,
}

/// Options for [`Frame::ip`].
#[derive(Clone, Debug)]
pub struct IpOpts {
    /// TTL / hop limit.
    pub ttl: u8,
    /// IPv4 identification.
    pub ident: u16,
    /// IPv4 Don't Fragment.
    pub dont_frag: bool,
    /// IPv4 options (length a multiple of 4, at most 40 bytes).
    pub v4_options: Vec<u8>,
    /// IPv6: (next header, bytes) extension headers placed before the L4 header, in order.
    pub v6_ext: Vec<(u8, Vec<u8>)>,
}

impl Default for IpOpts {
    fn default() -> Self {
        Self { ttl: 64, ident: 0x1234, dont_frag: true, v4_options: vec![], v6_ext: vec![] }
    }
}

/// A TCP segment header (20 bytes) plus payload, checksum left zero.
pub fn tcp_segment(sport: u16, dport: u16, flags: u8, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; 20];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s[4..8].copy_from_slice(&seq.to_be_bytes());
    s[8..12].copy_from_slice(&ack.to_be_bytes());
    s[12] = 5 << 4;
    s[13] = flags;
    s[14..16].copy_from_slice(&64240u16.to_be_bytes());
    s.extend_from_slice(payload);
    s
}

/// A UDP header plus payload, checksum left zero (filled by [`Frame::ip`]).
pub fn udp_datagram(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; 8];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    let len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
    s[4..6].copy_from_slice(&len.to_be_bytes());
    s.extend_from_slice(payload);
    s
}

/// An SCTP packet: common header with verification tag and one DATA-like chunk of `payload`.
pub fn sctp_packet(sport: u16, dport: u16, vtag: u32, payload: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; 12];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s[4..8].copy_from_slice(&vtag.to_be_bytes());
    s.extend_from_slice(payload);
    s
}

/// An ICMP / ICMPv6 message: type, code, 4 bytes of rest-of-header, then `body`.
pub fn icmp_message(ty: u8, code: u8, rest: [u8; 4], body: &[u8]) -> Vec<u8> {
    let mut s = vec![ty, code, 0, 0];
    s.extend_from_slice(&rest);
    s.extend_from_slice(body);
    s
}

impl Frame {
    /// Builds Ethernet + IP + `l4` with all checksums filled.
    pub fn ip(src: IpAddr, dst: IpAddr, l4_proto: u8, l4: &[u8], o: &IpOpts) -> Self {
        let mut b = Vec::with_capacity(14 + 60 + l4.len());
        b.extend_from_slice(&LB_MAC);
        b.extend_from_slice(&CLIENT_MAC);
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b.extend_from_slice(&0x0800u16.to_be_bytes());
                let hl = 20 + o.v4_options.len();
                let total = u16::try_from(hl + l4.len()).unwrap_or(u16::MAX);
                let mut h = vec![0u8; 20];
                h[0] = 0x40 | u8::try_from(hl / 4).unwrap_or(5);
                h[2..4].copy_from_slice(&total.to_be_bytes());
                h[4..6].copy_from_slice(&o.ident.to_be_bytes());
                if o.dont_frag {
                    h[6] = 0x40;
                }
                h[8] = o.ttl;
                h[9] = l4_proto;
                h[12..16].copy_from_slice(&s.octets());
                h[16..20].copy_from_slice(&d.octets());
                h.extend_from_slice(&o.v4_options);
                let c = csum::checksum(&h);
                h[10..12].copy_from_slice(&c.to_be_bytes());
                b.extend_from_slice(&h);
                let at = b.len();
                b.extend_from_slice(l4);
                fill_l4(&mut b[at..], &s.octets(), &d.octets(), l4_proto, false);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                b.extend_from_slice(&0x86DDu16.to_be_bytes());
                let ext_len: usize = o.v6_ext.iter().map(|(_, e)| e.len()).sum();
                let plen = u16::try_from(ext_len + l4.len()).unwrap_or(u16::MAX);
                let mut h = vec![0u8; 40];
                h[0] = 0x60;
                h[4..6].copy_from_slice(&plen.to_be_bytes());
                h[6] = o.v6_ext.first().map_or(l4_proto, |(nh, _)| *nh);
                h[7] = o.ttl;
                h[8..24].copy_from_slice(&s.octets());
                h[24..40].copy_from_slice(&d.octets());
                b.extend_from_slice(&h);
                for (i, (_, e)) in o.v6_ext.iter().enumerate() {
                    let mut e = e.clone();
                    if let Some(first) = e.first_mut() {
                        *first = o.v6_ext.get(i + 1).map_or(l4_proto, |(nh, _)| *nh);
                    }
                    b.extend_from_slice(&e);
                }
                let at = b.len();
                b.extend_from_slice(l4);
                fill_l4(&mut b[at..], &s.octets(), &d.octets(), l4_proto, true);
            }
            _ => {}
        }
        Self { bytes: b }
    }

    /// A TCP/IPv4 frame with no payload.
    pub fn tcp_v4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, flags: u8) -> Self {
        let seg = tcp_segment(sport, dport, flags, 1000, 0, &[]);
        Self::ip(src.into(), dst.into(), proto::TCP, &seg, &IpOpts::default())
    }

    /// A TCP/IPv6 frame with no payload.
    pub fn tcp_v6(src: [u8; 16], sport: u16, dst: [u8; 16], dport: u16, flags: u8) -> Self {
        let seg = tcp_segment(sport, dport, flags, 1000, 0, &[]);
        Self::ip(src.into(), dst.into(), proto::TCP, &seg, &IpOpts::default())
    }

    /// A UDP/IPv4 frame with `payload`.
    pub fn udp_v4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Self {
        Self::ip(src.into(), dst.into(), proto::UDP, &udp_datagram(sport, dport, payload), &IpOpts::default())
    }

    /// A UDP/IPv6 frame with `payload`.
    pub fn udp_v6(src: [u8; 16], sport: u16, dst: [u8; 16], dport: u16, payload: &[u8]) -> Self {
        Self::ip(src.into(), dst.into(), proto::UDP, &udp_datagram(sport, dport, payload), &IpOpts::default())
    }

    /// A UDP/IPv4 frame with `opt_len` bytes of IPv4 options (NOPs then EOL).
    pub fn udp_v4_opts(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, opt_len: usize) -> Self {
        let mut opts = vec![1u8; opt_len];
        if let Some(l) = opts.last_mut() {
            *l = 0;
        }
        let o = IpOpts { v4_options: opts, ..IpOpts::default() };
        Self::ip(src.into(), dst.into(), proto::UDP, &udp_datagram(sport, dport, b"hello"), &o)
    }

    /// A UDP/IPv6 frame behind a Hop-by-Hop and a Destination-options header, and optionally a
    /// Fragment header marking it as a first fragment (M=1, offset 0).
    pub fn udp_v6_with_ext(src: [u8; 16], sport: u16, dst: [u8; 16], dport: u16, first_fragment: bool) -> Self {
        let mut ext =
            vec![(proto::HOPOPT, vec![0, 0, 1, 4, 0, 0, 0, 0]), (proto::DSTOPTS, vec![0, 0, 1, 4, 0, 0, 0, 0])];
        if first_fragment {
            ext.push((proto::FRAGMENT, vec![0, 0, 0, 1, 0, 0, 0x42, 0x42]));
        }
        let o = IpOpts { v6_ext: ext, ..IpOpts::default() };
        Self::ip(src.into(), dst.into(), proto::UDP, &udp_datagram(sport, dport, b"hello"), &o)
    }

    /// Adds an 802.1Q tag with `vid` after the MAC addresses.
    pub fn vlan(&mut self, vid: u16) -> &mut Self {
        let tag = [0x81, 0x00, (vid >> 8) as u8 & 0x0f, (vid & 0xff) as u8];
        self.bytes.splice(12..12, tag);
        self
    }

    /// Sets the Ethernet source and destination MACs.
    pub fn macs(&mut self, src: [u8; 6], dst: [u8; 6]) -> &mut Self {
        self.bytes[0..6].copy_from_slice(&dst);
        self.bytes[6..12].copy_from_slice(&src);
        self
    }
}

/// Fills the L4 checksum of `seg` for the given addresses (SCTP: CRC32c; ICMPv4: no
/// pseudo-header; others: pseudo-header).
pub fn fill_l4(seg: &mut [u8], src: &[u8], dst: &[u8], l4_proto: u8, v6: bool) {
    let at = match l4_proto {
        proto::TCP => 16,
        proto::UDP => 6,
        proto::ICMP | proto::ICMPV6 => 2,
        proto::SCTP => {
            csum::sctp_crc_update_ports(seg);
            return;
        }
        _ => return,
    };
    if seg.len() < at + 2 {
        return;
    }
    seg[at..at + 2].fill(0);
    let sum = if l4_proto == proto::ICMP {
        csum::add_bytes(0, seg)
    } else {
        let len = u32::try_from(seg.len()).unwrap_or(u32::MAX);
        csum::add_bytes(csum::pseudo_header(src, dst, l4_proto, len), seg)
    };
    let mut c = !csum::fold(sum);
    if l4_proto == proto::UDP && c == 0 {
        c = 0xffff;
    }
    seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
    let _ = v6;
}

/// Recomputes every checksum of `frame` from scratch and reports the first that differs
/// from what is stored. Handles one VLAN tag, IPv4 options, IPv6 extension headers, IPIP and
/// IP6IP6 (recursing into the inner packet), and a UDP/IPv4 zero checksum.
///
/// # Errors
/// A description of the first mismatch or parse failure.
pub fn verify(frame: &[u8]) -> Result<(), String> {
    let (l3, at) = wire::ethernet(frame).map_err(|e| format!("{e:?}"))?;
    let p = match l3 {
        wire::L3::V4 => wire::parse_v4(frame, at),
        wire::L3::V6 => wire::parse_v6(frame, at),
        wire::L3::Other => return Ok(()),
    }
    .map_err(|e| format!("{e:?}"))?;
    verify_ip(frame, p.l3, l3 == wire::L3::V6)
}

fn verify_ip(frame: &[u8], l3: usize, v6: bool) -> Result<(), String> {
    let (p, src, dst) = if v6 {
        let p = wire::parse_v6(frame, l3 - 2).map_err(|e| format!("{e:?}"))?;
        (p, frame[l3 + 8..l3 + 24].to_vec(), frame[l3 + 24..l3 + 40].to_vec())
    } else {
        let p = wire::parse_v4(frame, l3 - 2).map_err(|e| format!("{e:?}"))?;
        let hl = p.l4 - l3;
        if csum::checksum(&frame[l3..l3 + hl]) != 0 {
            return Err("IPv4 header checksum".into());
        }
        (p, frame[l3 + 12..l3 + 16].to_vec(), frame[l3 + 16..l3 + 20].to_vec())
    };
    if matches!(p.frag, wire::Frag::First { .. } | wire::Frag::Later { .. }) {
        return Ok(()); // the L4 checksum covers the reassembled datagram
    }
    let seg = &frame[p.l4..p.end];
    match p.proto {
        proto::IPIP => return verify_ip(frame, p.l4, false),
        proto::IPV6 => return verify_ip(frame, p.l4, true),
        proto::SCTP => {
            let mut s = seg.to_vec();
            let stored = s[8..12].to_vec();
            csum::sctp_crc_update_ports(&mut s);
            if s[8..12] != stored[..] {
                return Err("SCTP CRC32c".into());
            }
            return Ok(());
        }
        proto::UDP if !v6 && seg[6..8] == [0, 0] => return Ok(()),
        proto::TCP | proto::UDP | proto::ICMPV6 => {}
        proto::ICMP => {
            return if csum::checksum(seg) == 0 { Ok(()) } else { Err("ICMP checksum".into()) };
        }
        _ => return Ok(()),
    }
    let len = u32::try_from(seg.len()).unwrap_or(u32::MAX);
    let sum = csum::add_bytes(csum::pseudo_header(&src, &dst, p.proto, len), seg);
    if csum::fold(sum) != 0xffff {
        return Err(format!("L4 checksum of protocol {}", p.proto));
    }
    Ok(())
}
