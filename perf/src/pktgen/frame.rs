//! Frame templates, per-packet patching, flow cycling and the payload stamp.
//!
//! Every generated frame is Ethernet + IPv4 (20 bytes, DF, TTL 64) + UDP or TCP (20 bytes,
//! no options) + payload. The payload starts with a 16-byte *stamp*:
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | tag, big-endian: magic `0x584C` ("XL") in bits 63..48, run id in bits 47..40, sequence number in bits 39..0 |
//! | 8..16 | CLOCK_MONOTONIC send time in ns, big-endian |
//!
//! The rest of the payload is zero. Per packet only the source IPv4 address, the IPv4 header
//! checksum, the source port, the stamp and the L4 checksum change; [`Template::patch`]
//! writes exactly those and derives both checksums incrementally (RFC 1624 eqn. 3) from the
//! template's, which were computed with a zero source port and a zero stamp.

use std::net::Ipv4Addr;

use dataplane::build::{self, Frame, IpOpts};
use dataplane::csum;

/// Magic in the top 16 bits of the tag ("XL").
pub const MAGIC: u16 = 0x584c;
/// Length of the payload stamp (tag + timestamp).
pub const STAMP_LEN: usize = 16;
/// Source ports used per source address: `BASE_PORT..BASE_PORT + PORTS_PER_IP`.
pub const PORTS_PER_IP: u64 = 60_000;
/// First source port.
pub const BASE_PORT: u16 = 1024;
/// Tuple space of `--proto syn` (every packet a new flow): 2^24 tuples, i.e. 280 source
/// addresses × 60,000 ports, so a tuple repeats only after 16.7 M packets.
pub const SYN_SPACE: u64 = 1 << 24;
/// Largest supported frame (one 2048-byte UMEM frame, standard MTU).
pub const MAX_FRAME: usize = 1514;

const ETH: usize = 14;
const IP: usize = ETH;
const IP_CSUM: usize = IP + 10;
const SRC_IP: usize = IP + 12;
const L4: usize = IP + 20;
const SEQ_MASK: u64 = (1 << 40) - 1;

/// Transport of the generated frames.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// UDP datagrams.
    Udp,
    /// TCP SYN-only segments; every packet is a new flow (see [`SYN_SPACE`]).
    Syn,
    /// TCP segments with only the ACK flag (look like established connections).
    Tcp,
}

impl Proto {
    /// Header bytes before the payload (Ethernet + IPv4 + L4).
    pub fn header_len(self) -> usize {
        match self {
            Self::Udp => L4 + 8,
            Self::Syn | Self::Tcp => L4 + 20,
        }
    }

    /// Smallest frame that holds the headers and the stamp: 58 for UDP (so the Ethernet
    /// minimum of 60 applies), 70 for TCP.
    pub fn min_frame(self) -> usize {
        (self.header_len() + STAMP_LEN).max(60)
    }

    /// Offset of the L4 checksum in the frame.
    fn csum_at(self) -> usize {
        match self {
            Self::Udp => L4 + 6,
            Self::Syn | Self::Tcp => L4 + 16,
        }
    }

    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Syn => "syn",
            Self::Tcp => "tcp",
        }
    }
}

/// Builds the 64-bit tag of a stamp.
#[inline]
pub fn tag(run: u8, seq: u64) -> u64 {
    (u64::from(MAGIC) << 48) | (u64::from(run) << 40) | (seq & SEQ_MASK)
}

/// A set of `n` distinct (source address, source port) pairs; destination address, port and
/// protocol are fixed, so these are `n` distinct 5-tuples. Tuple `i` is
/// (`base + i / 60000`, `1024 + i % 60000`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FlowSpace {
    base: u32,
    n: u64,
}

impl FlowSpace {
    /// `n` tuples starting at source address `base`.
    ///
    /// # Errors
    /// `n` is 0, or the source addresses would run past 255.255.255.255.
    pub fn new(base: Ipv4Addr, n: u64) -> Result<Self, String> {
        if n == 0 {
            return Err("--flows must be at least 1".into());
        }
        let last = u64::from(u32::from(base)) + (n - 1) / PORTS_PER_IP;
        if last > u64::from(u32::MAX) {
            return Err(format!("{n} flows from {base} need source addresses past 255.255.255.255"));
        }
        Ok(Self { base: u32::from(base), n })
    }

    /// Number of tuples.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false (a space has at least one tuple).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Tuple `i` (taken modulo the size).
    pub fn tuple(&self, i: u64) -> (Ipv4Addr, u16) {
        let i = i % self.n;
        let ip = self.base + u32::try_from(i / PORTS_PER_IP).unwrap_or(0);
        let port = BASE_PORT + u16::try_from(i % PORTS_PER_IP).unwrap_or(0);
        (Ipv4Addr::from(ip), port)
    }

    /// A round-robin cursor over the tuples, starting at tuple 0.
    pub fn cursor(&self) -> FlowCursor {
        FlowCursor { space: *self, i: 0, ip: self.base, port: BASE_PORT }
    }
}

/// Round-robin iterator over a [`FlowSpace`] (endless; no division per packet).
#[derive(Clone, Debug)]
pub struct FlowCursor {
    space: FlowSpace,
    i: u64,
    ip: u32,
    port: u16,
}

impl FlowCursor {
    /// The next tuple as (source address as u32, source port).
    #[inline]
    pub fn next_tuple(&mut self) -> (u32, u16) {
        let out = (self.ip, self.port);
        self.i += 1;
        if self.i == self.space.n {
            self.i = 0;
            self.ip = self.space.base;
            self.port = BASE_PORT;
        } else if u64::from(self.port - BASE_PORT) + 1 == PORTS_PER_IP {
            self.port = BASE_PORT;
            self.ip += 1;
        } else {
            self.port += 1;
        }
        out
    }
}

/// What the generator sends: addresses, protocol and size.
#[derive(Clone, Debug)]
pub struct FrameSpec {
    /// Ethernet source.
    pub src_mac: [u8; 6],
    /// Ethernet destination (the load balancer's port).
    pub dst_mac: [u8; 6],
    /// First source address (see [`FlowSpace`]).
    pub src_ip: Ipv4Addr,
    /// Destination address (the VIP).
    pub dst_ip: Ipv4Addr,
    /// Destination port.
    pub dst_port: u16,
    /// Transport.
    pub proto: Proto,
    /// Ethernet frame length without FCS.
    pub size: usize,
}

/// A prebuilt frame plus what [`Template::patch`] needs to rewrite it per packet.
#[derive(Clone, Debug)]
pub struct Template {
    bytes: Vec<u8>,
    proto: Proto,
    base_ip: u32,
    /// `~HC` of the template's IPv4 header checksum.
    ip_sum: u32,
    /// `~HC` of the template's L4 checksum (source port 0, stamp 0), with the base source
    /// address's words already subtracted (one's complement), so adding the packet's
    /// address words gives the right pseudo-header sum.
    l4_sum: u32,
    stamp_at: usize,
}

#[inline]
fn words(x: u32) -> u32 {
    (x >> 16) + (x & 0xffff)
}

impl Template {
    /// Builds the template.
    ///
    /// # Errors
    /// The size is below [`Proto::min_frame`] or above [`MAX_FRAME`].
    pub fn new(spec: &FrameSpec) -> Result<Self, String> {
        let p = spec.proto;
        if spec.size < p.min_frame() || spec.size > MAX_FRAME {
            return Err(format!(
                "--size {} for {}: must be {}..={} (Ethernet + IPv4 + {} header + the {STAMP_LEN}-byte stamp)",
                spec.size,
                p.name(),
                p.min_frame(),
                MAX_FRAME,
                if p == Proto::Udp { "UDP" } else { "TCP" }
            ));
        }
        let payload = vec![0u8; spec.size - p.header_len()];
        let (l4_proto, seg) = match p {
            Proto::Udp => (dataplane::wire::proto::UDP, build::udp_datagram(0, spec.dst_port, &payload)),
            // SYN: seq 1, no ACK; established-looking: ACK only, fixed seq/ack.
            Proto::Syn => (dataplane::wire::proto::TCP, build::tcp_segment(0, spec.dst_port, 0x02, 1, 0, &payload)),
            Proto::Tcp => (
                dataplane::wire::proto::TCP,
                build::tcp_segment(0, spec.dst_port, 0x10, 1_000_001, 2_000_001, &payload),
            ),
        };
        let o = IpOpts { ttl: 64, ident: 0, dont_frag: true, ..IpOpts::default() };
        let mut f = Frame::ip(spec.src_ip.into(), spec.dst_ip.into(), l4_proto, &seg, &o);
        f.macs(spec.src_mac, spec.dst_mac);
        let bytes = f.bytes;
        debug_assert_eq!(bytes.len(), spec.size);
        let rd = |at: usize| u16::from_be_bytes([bytes[at], bytes[at + 1]]);
        let base_ip = u32::from(spec.src_ip);
        let ip_sum = u32::from(!rd(IP_CSUM));
        let mut l4c = rd(p.csum_at());
        if p == Proto::Udp && l4c == 0xffff {
            // RFC 768 sends a computed 0 as 0xFFFF; both are one's-complement zero.
            l4c = 0;
        }
        // Subtract the base address (add its complement) once here.
        let l4_sum = u32::from(!l4c) + u32::from(!((base_ip >> 16) as u16)) + u32::from(!(base_ip as u16));
        Ok(Self { bytes, proto: p, base_ip, ip_sum, l4_sum, stamp_at: p.header_len() })
    }

    /// The template bytes (source port 0, stamp 0, checksums valid for those).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Frame length.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Rewrites the per-packet fields of `buf`, which must already hold this template (as
    /// written by a previous `patch` or a copy of [`Template::bytes`]): source address and
    /// port, stamp, and both checksums. Every variable field is written, so the previous
    /// packet's values do not matter.
    #[inline]
    pub fn patch(&self, buf: &mut [u8], src_ip: u32, sport: u16, tag: u64, ts_ns: u64) {
        let buf = &mut buf[..self.bytes.len()];
        buf[SRC_IP..SRC_IP + 4].copy_from_slice(&src_ip.to_be_bytes());
        // RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m') over the two address words.
        let ip_c = !csum::fold(self.ip_sum + words(!self.base_ip) + words(src_ip));
        buf[IP_CSUM..IP_CSUM + 2].copy_from_slice(&ip_c.to_be_bytes());
        buf[L4..L4 + 2].copy_from_slice(&sport.to_be_bytes());
        let s = self.stamp_at;
        buf[s..s + 8].copy_from_slice(&tag.to_be_bytes());
        buf[s + 8..s + 16].copy_from_slice(&ts_ns.to_be_bytes());
        let sum = self.l4_sum
            + words(src_ip)
            + u32::from(sport)
            + words((tag >> 32) as u32)
            + words(tag as u32)
            + words((ts_ns >> 32) as u32)
            + words(ts_ns as u32);
        let mut c = !csum::fold(sum);
        if self.proto == Proto::Udp && c == 0 {
            c = 0xffff;
        }
        let at = self.proto.csum_at();
        buf[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
}

/// A stamp found in a received frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Run id (the generator uses a different id per phase and trial).
    pub run: u8,
    /// Sequence number (40 bits).
    pub seq: u64,
    /// CLOCK_MONOTONIC send time, ns.
    pub ts_ns: u64,
}

/// Finds the stamp in a received frame: Ethernet (one optional 802.1Q tag) + IPv4 (any
/// header length, first fragment or unfragmented; one level of IPv4-in-IPv4 is followed, for
/// tunnelling load balancers) + UDP or TCP (any data offset), then the first 16 payload bytes
/// must start with [`MAGIC`]. Anything else (ARP, IPv6, other traffic) gives `None`.
pub fn parse_stamp(frame: &[u8]) -> Option<Stamp> {
    let rd16 = |at: usize| -> Option<u16> { Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?])) };
    let mut et_at = 12;
    let mut et = rd16(et_at)?;
    if et == 0x8100 {
        et_at += 4;
        et = rd16(et_at)?;
    }
    if et != 0x0800 {
        return None;
    }
    let mut l3 = et_at + 2;
    let mut end = frame.len();
    for _ in 0..2 {
        let vihl = *frame.get(l3)?;
        let ihl = usize::from(vihl & 0x0f) * 4;
        if vihl >> 4 != 4 || ihl < 20 {
            return None;
        }
        let total = usize::from(rd16(l3 + 2)?);
        if total < ihl {
            return None;
        }
        end = end.min(l3 + total);
        if rd16(l3 + 6)? & 0x1fff != 0 {
            return None; // a later fragment: no L4 header
        }
        let proto = *frame.get(l3 + 9)?;
        let l4 = l3 + ihl;
        let payload = match proto {
            4 => {
                l3 = l4;
                continue;
            }
            17 => l4 + 8,
            6 => l4 + usize::from(*frame.get(l4 + 12)? >> 4) * 4,
            _ => return None,
        };
        if payload + STAMP_LEN > end {
            return None;
        }
        let tag = u64::from_be_bytes(frame[payload..payload + 8].try_into().ok()?);
        if (tag >> 48) as u16 != MAGIC {
            return None;
        }
        let ts_ns = u64::from_be_bytes(frame[payload + 8..payload + 16].try_into().ok()?);
        return Some(Stamp { run: (tag >> 40) as u8, seq: tag & SEQ_MASK, ts_ns });
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use smoltcp::wire::{EthernetFrame, IpAddress, Ipv4Packet, TcpPacket, UdpPacket};

    use super::*;

    fn spec(proto: Proto, size: usize) -> FrameSpec {
        FrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(10, 1, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 100),
            dst_port: 80,
            proto,
            size,
        }
    }

    /// Checks every checksum with smoltcp (independent of dataplane's csum code) and with
    /// dataplane's from-scratch verifier.
    fn assert_checksums(f: &[u8]) {
        build::verify(f).unwrap();
        let eth = EthernetFrame::new_checked(f).unwrap();
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert!(ip.verify_checksum(), "IPv4 header checksum");
        let (s, d) = (IpAddress::Ipv4(ip.src_addr()), IpAddress::Ipv4(ip.dst_addr()));
        match ip.next_header() {
            smoltcp::wire::IpProtocol::Udp => {
                let u = UdpPacket::new_checked(ip.payload()).unwrap();
                assert_ne!(u.checksum(), 0, "UDP checksum must be present");
                assert!(u.verify_checksum(&s, &d), "UDP checksum");
            }
            smoltcp::wire::IpProtocol::Tcp => {
                let t = TcpPacket::new_checked(ip.payload()).unwrap();
                assert!(t.verify_checksum(&s, &d), "TCP checksum");
            }
            p => panic!("unexpected protocol {p}"),
        }
    }

    #[test]
    fn template_and_patched_frames_have_valid_checksums() {
        for (proto, size) in
            [(Proto::Udp, 60), (Proto::Udp, 64), (Proto::Udp, 1514), (Proto::Syn, 70), (Proto::Tcp, 128)]
        {
            let t = Template::new(&spec(proto, size)).unwrap();
            assert_eq!(t.len(), size);
            assert_checksums(t.bytes());
            let mut buf = t.bytes().to_vec();
            let base = u32::from(Ipv4Addr::new(10, 1, 0, 1));
            // Includes words that sum to 0/0xffff, address changes and back, every port.
            let cases = [
                (base, 1024u16, tag(0, 0), 0u64),
                (base + 1, 65535, tag(255, SEQ_MASK), u64::MAX),
                (base, 1, tag(7, 0x1234_5678), 0x0123_4567_89ab_cdef),
                (base + 279, 61023, tag(1, 1), 1_700_000_000_000_000_000),
                (base, 0, 0, 0),
            ];
            for (ip, port, tg, ts) in cases {
                t.patch(&mut buf, ip, port, tg, ts);
                assert_checksums(&buf);
                // The same as a frame built from scratch with those fields.
                let mut s = spec(proto, size);
                s.src_ip = Ipv4Addr::from(ip);
                let eth = EthernetFrame::new_checked(&buf[..]).unwrap();
                let ipp = Ipv4Packet::new_checked(eth.payload()).unwrap();
                assert_eq!(ipp.src_addr(), s.src_ip);
                let st = parse_stamp(&buf);
                if tg >> 48 == u64::from(MAGIC) {
                    let st = st.unwrap();
                    assert_eq!((st.run, st.seq, st.ts_ns), ((tg >> 40) as u8, tg & SEQ_MASK, ts));
                } else {
                    assert_eq!(st, None);
                }
            }
            for seq in 0..2000u64 {
                let ts = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                t.patch(&mut buf, base + (seq as u32 % 3), (seq as u16).wrapping_mul(31), tag(3, seq), ts);
                assert_checksums(&buf);
            }
        }
    }

    #[test]
    fn size_limits() {
        assert!(Template::new(&spec(Proto::Udp, 59)).is_err());
        assert!(Template::new(&spec(Proto::Udp, 60)).is_ok());
        assert!(Template::new(&spec(Proto::Tcp, 64)).is_err());
        assert!(Template::new(&spec(Proto::Syn, 69)).is_err());
        assert!(Template::new(&spec(Proto::Syn, 70)).is_ok());
        assert!(Template::new(&spec(Proto::Udp, 1515)).is_err());
        assert_eq!(Proto::Udp.min_frame(), 60);
        assert_eq!(Proto::Tcp.min_frame(), 70);
    }

    #[test]
    fn tcp_flags() {
        let syn = Template::new(&spec(Proto::Syn, 70)).unwrap();
        let ack = Template::new(&spec(Proto::Tcp, 70)).unwrap();
        let flags = |t: &Template| {
            let eth = EthernetFrame::new_checked(t.bytes()).unwrap();
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
            (tcp.syn(), tcp.ack(), tcp.rst(), tcp.fin(), tcp.dst_port())
        };
        assert_eq!(flags(&syn), (true, false, false, false, 80));
        assert_eq!(flags(&ack), (false, true, false, false, 80));
    }

    fn distinct(space: FlowSpace, packets: u64) -> HashSet<(u32, u16)> {
        let mut c = space.cursor();
        (0..packets).map(|_| c.next_tuple()).collect()
    }

    #[test]
    fn flows_are_exactly_n_distinct_tuples_round_robin() {
        let base = Ipv4Addr::new(10, 1, 0, 1);
        for n in [1u64, 2, 100, 59_999, 60_000, 60_001, 130_000] {
            let space = FlowSpace::new(base, n).unwrap();
            let set = distinct(space, 2 * n + 5);
            assert_eq!(set.len() as u64, n, "n = {n}");
            // Round-robin: packet i uses tuple i mod n, and the cursor agrees with `tuple`.
            let mut c = space.cursor();
            for i in 0..(2 * n + 5) {
                let (ip, port) = c.next_tuple();
                assert_eq!((Ipv4Addr::from(ip), port), space.tuple(i), "n = {n}, i = {i}");
                assert!(port >= BASE_PORT);
            }
        }
        let space = FlowSpace::new(base, 130_000).unwrap();
        assert_eq!(space.tuple(59_999), (base, 61_023));
        assert_eq!(space.tuple(60_000), (Ipv4Addr::new(10, 1, 0, 2), 1024));
        assert_eq!(space.tuple(129_999), (Ipv4Addr::new(10, 1, 0, 3), 1024 + 9_999));
        assert!(FlowSpace::new(base, 0).is_err());
        assert!(FlowSpace::new(Ipv4Addr::new(255, 255, 255, 255), 60_001).is_err());
        assert!(FlowSpace::new(Ipv4Addr::new(255, 255, 255, 255), 60_000).is_ok());
    }

    #[test]
    fn syn_space_never_repeats_within_its_size() {
        let space = FlowSpace::new(Ipv4Addr::new(10, 1, 0, 1), SYN_SPACE).unwrap();
        let mut c = space.cursor();
        // One bit per (address offset, port) pair: 280 × 60,000 ≥ 2^24.
        let base = u32::from(Ipv4Addr::new(10, 1, 0, 1));
        let mut seen = vec![false; 281 * PORTS_PER_IP as usize];
        for _ in 0..SYN_SPACE {
            let (ip, port) = c.next_tuple();
            let k = (ip - base) as usize * PORTS_PER_IP as usize + usize::from(port - BASE_PORT);
            assert!(!seen[k], "tuple {k} repeated");
            seen[k] = true;
        }
        assert_eq!(c.next_tuple(), (u32::from(Ipv4Addr::new(10, 1, 0, 1)), BASE_PORT));
    }

    #[test]
    fn parse_stamp_after_rewrites_and_encapsulation() {
        let t = Template::new(&spec(Proto::Udp, 64)).unwrap();
        let mut f = t.bytes().to_vec();
        t.patch(&mut f, u32::from(Ipv4Addr::new(10, 1, 0, 1)), 5000, tag(9, 42), 123_456_789);
        let want = Stamp { run: 9, seq: 42, ts_ns: 123_456_789 };
        assert_eq!(parse_stamp(&f), Some(want));

        // An LB rewrites MACs, addresses and ports: still found.
        let mut g = f.clone();
        g[0..12].fill(0xaa);
        g[30..34].copy_from_slice(&[10, 2, 0, 11]);
        g[36..38].copy_from_slice(&8080u16.to_be_bytes());
        assert_eq!(parse_stamp(&g), Some(want));

        // VLAN tag.
        let mut v = f.clone();
        v.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        assert_eq!(parse_stamp(&v), Some(want));

        // IPv4-in-IPv4 (DSR/tunnel): outer header inserted after Ethernet.
        let mut outer = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 4, 0, 0, 10, 0, 0, 1, 10, 2, 0, 11];
        let total = u16::try_from(20 + f.len() - 14).unwrap();
        outer[2..4].copy_from_slice(&total.to_be_bytes());
        let mut ipip = f[..14].to_vec();
        ipip.extend_from_slice(&outer);
        ipip.extend_from_slice(&f[14..]);
        assert_eq!(parse_stamp(&ipip), Some(want));

        // TCP with options (data offset 8) after a rewrite.
        let tt = Template::new(&spec(Proto::Tcp, 100)).unwrap();
        let mut tf = tt.bytes().to_vec();
        tt.patch(&mut tf, u32::from(Ipv4Addr::new(10, 1, 0, 1)), 7, tag(1, 2), 3);
        assert_eq!(parse_stamp(&tf), Some(Stamp { run: 1, seq: 2, ts_ns: 3 }));
        let mut opt = tf.clone();
        opt.splice(54..54, [1u8; 12]);
        opt[46] = 8 << 4;
        let tl = u16::from_be_bytes([opt[16], opt[17]]) + 12;
        opt[16..18].copy_from_slice(&tl.to_be_bytes());
        assert_eq!(parse_stamp(&opt), Some(Stamp { run: 1, seq: 2, ts_ns: 3 }));

        // Not ours: wrong magic, truncated, later fragment, ARP, IPv6, garbage.
        let mut bad = f.clone();
        bad[42] ^= 1;
        assert_eq!(parse_stamp(&bad), None);
        assert_eq!(parse_stamp(&f[..50]), None);
        let mut frag = f.clone();
        frag[20] = 0x00;
        frag[21] = 0x10;
        assert_eq!(parse_stamp(&frag), None);
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse_stamp(&arp), None);
        let v6 = build::Frame::udp_v6([1; 16], 1, [2; 16], 2, &[0x58, 0x4c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_stamp(&v6.bytes), None);
        assert_eq!(parse_stamp(&[]), None);
        assert_eq!(parse_stamp(&[0xff; 13]), None);
        // IP total length shorter than the frame (Ethernet padding): the stamp must lie
        // inside the IP packet.
        let mut short = f.clone();
        short[16..18].copy_from_slice(&(20u16 + 8 + 8).to_be_bytes());
        assert_eq!(parse_stamp(&short), None);
    }
}
