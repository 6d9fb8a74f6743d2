//! Address families, shared by conntrack, the fragment table and the rewrites.
//!
//! The pipeline is generic over [`Family`] so IPv4 and IPv6 share one body of
//! code (monomorphised) while IPv4 conntrack keys stay 4-byte-address small.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use core::fmt::Debug;
use core::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytemuck::{Pod, Zeroable};

/// An IP address family: IPv4 (RFC 791) or IPv6 (RFC 8200).
pub trait Family: Copy + Eq + Hash + Debug + Default + Send + Sync + Pod + 'static {
    /// Address length in bytes (4 or 16).
    const LEN: usize;
    /// Fixed IP header length in bytes (20 without options, or 40).
    const HEADER_LEN: usize;
    /// EtherType of this family (0x0800 or 0x86DD).
    const ETHERTYPE: u16;
    /// The all-zero address, used for unset fields.
    const UNSPECIFIED: Self;
    /// Offset of the source address in the IP header (12 or 8).
    const SRC_OFF: usize;
    /// Offset of the destination address in the IP header (16 or 24).
    const DST_OFF: usize;
    /// Offset of the TTL / hop-limit byte in the IP header (8 or 7).
    const TTL_OFF: usize;
    /// Whether this is IPv6.
    const IS_V6: bool;
    /// The address bytes in network order; `len() == Self::LEN`.
    fn octets(&self) -> &[u8];
    /// Reads an address from the first `Self::LEN` bytes of `b`; `None` if `b` is shorter.
    fn from_slice(b: &[u8]) -> Option<Self>;
    /// The address as a standard-library [`IpAddr`].
    fn to_ip(self) -> IpAddr;
    /// The address as 16 bytes: IPv6 as is, IPv4 as an IPv4-mapped IPv6 address (RFC 4291 §2.5.5.2).
    fn to_mapped(self) -> [u8; 16];
    /// Extracts this family's address from `ip`; `None` if `ip` is of the other family.
    fn from_ip(ip: IpAddr) -> Option<Self>;
    /// Whether this is a martian source, one no packet on the wire may carry (RFC 1812
    /// §5.3.7, §4.2.2.11; Linux's `ip_route_input_slow` and `ip6_rcv_core` drop the same but
    /// for class E): IPv4 0.0.0.0/8, 127.0.0.0/8, 224.0.0.0/4 (multicast) and 240.0.0.0/4
    /// (class E, reserved, with 255.255.255.255); IPv6 `::`, `::1` and ff00::/8 (multicast).
    /// The IPv4 set is [`crate::icmp::may_answer`]'s.
    fn is_martian_source(&self) -> bool;
}

/// An IPv4 address in network byte order. Plain bytes (`Pod`), so flow records holding it
/// can live in memory mapped by the conntrack (see [`crate::conntrack`]).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord, Pod, Zeroable)]
#[repr(transparent)]
pub struct V4(pub [u8; 4]);

/// An IPv6 address in network byte order; `Pod` like [`V4`].
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord, Pod, Zeroable)]
#[repr(transparent)]
pub struct V6(pub [u8; 16]);

impl Family for V4 {
    const LEN: usize = 4;
    const HEADER_LEN: usize = 20;
    const ETHERTYPE: u16 = 0x0800;
    const UNSPECIFIED: Self = Self([0; 4]);
    const SRC_OFF: usize = 12;
    const DST_OFF: usize = 16;
    const TTL_OFF: usize = 8;
    const IS_V6: bool = false;
    #[inline]
    fn octets(&self) -> &[u8] {
        &self.0
    }
    #[inline]
    fn from_slice(b: &[u8]) -> Option<Self> {
        b.get(..4)?.try_into().ok().map(Self)
    }
    fn to_ip(self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(self.0))
    }
    fn to_mapped(self) -> [u8; 16] {
        Ipv4Addr::from(self.0).to_ipv6_mapped().octets()
    }
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(Self(a.octets())),
            IpAddr::V6(_) => None,
        }
    }
    #[inline]
    fn is_martian_source(&self) -> bool {
        // 0/8 and 224/4 to 255/8 in one compare (0 wraps to 255).
        let [a, ..] = self.0;
        a == 127 || a.wrapping_sub(1) >= 223
    }
}

impl Family for V6 {
    const LEN: usize = 16;
    const HEADER_LEN: usize = 40;
    const ETHERTYPE: u16 = 0x86DD;
    const UNSPECIFIED: Self = Self([0; 16]);
    const SRC_OFF: usize = 8;
    const DST_OFF: usize = 24;
    const TTL_OFF: usize = 7;
    const IS_V6: bool = true;
    #[inline]
    fn octets(&self) -> &[u8] {
        &self.0
    }
    #[inline]
    fn from_slice(b: &[u8]) -> Option<Self> {
        b.get(..16)?.try_into().ok().map(Self)
    }
    fn to_ip(self) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from(self.0))
    }
    fn to_mapped(self) -> [u8; 16] {
        self.0
    }
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(a) => Some(Self(a.octets())),
            IpAddr::V4(_) => None,
        }
    }
    #[inline]
    fn is_martian_source(&self) -> bool {
        let [a, ..] = self.0;
        a == 0xff || u128::from_be_bytes(self.0) <= 1
    }
}

/// Maps any address to 16 bytes (IPv4 as IPv4-mapped, RFC 4291 §2.5.5.2); the key form of the
/// service tables, so one map serves both families.
pub fn mapped(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// An IP prefix (CIDR), e.g. `10.0.0.0/8` or `fd00::/64`; used for
/// `loadBalancerSourceRanges` and `nodePortAddresses`.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Cidr {
    /// Network address, host bits zero.
    pub addr: IpAddr,
    /// Prefix length in bits: 0..=32 for IPv4, 0..=128 for IPv6.
    pub len: u8,
}

/// A string that is not a valid CIDR.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid CIDR {text:?}: {why}")]
pub struct CidrParseError {
    /// The text that was given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl Cidr {
    /// Whether `ip` lies inside this prefix (false across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.len),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.len),
            _ => false,
        }
    }

    /// Whether the address given as raw octets (4 or 16 bytes) lies inside this prefix.
    #[inline]
    pub fn contains_octets(&self, octets: &[u8]) -> bool {
        match (self.addr, octets.len()) {
            (IpAddr::V4(n), 4) => prefix_eq(&n.octets(), octets, self.len),
            (IpAddr::V6(n), 16) => prefix_eq(&n.octets(), octets, self.len),
            _ => false,
        }
    }
}

fn prefix_eq(net: &[u8], a: &[u8], len: u8) -> bool {
    let full = usize::from(len / 8);
    let rem = len % 8;
    if net.get(..full) != a.get(..full) {
        return false;
    }
    if rem == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rem);
    match (net.get(full), a.get(full)) {
        (Some(n), Some(x)) => n & mask == x & mask,
        _ => false,
    }
}

impl core::str::FromStr for Cidr {
    type Err = CidrParseError;
    /// Parses `ADDR/LEN`, or a bare address as a host prefix (/32 or /128). Host bits must be zero.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| CidrParseError { text: s.to_owned(), why };
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| err("not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            Some(l) => l.trim().parse::<u8>().map_err(|_| err("prefix length is not a number"))?,
            None => max,
        };
        if len > max {
            return Err(err("prefix length too long for the address family"));
        }
        let c = Self { addr, len };
        let host_bits_zero = match addr {
            IpAddr::V4(n) => {
                let v = u32::from(n);
                len == 32 || v & (u32::MAX >> len) == 0
            }
            IpAddr::V6(n) => {
                let v = u128::from(n);
                len == 128 || v & (u128::MAX >> len) == 0
            }
        };
        if !host_bits_zero {
            return Err(err("host bits are set"));
        }
        Ok(c)
    }
}

impl core::fmt::Display for Cidr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;

    #[test]
    fn cidr_contains_respects_partial_bytes() {
        let c: Cidr = "10.1.128.0/17".parse().unwrap();
        assert!(c.contains("10.1.200.3".parse().unwrap()));
        assert!(!c.contains("10.1.127.3".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        assert!(all.contains_octets(&[9, 9, 9, 9]));
    }

    #[test]
    fn cidr_with_host_bits_is_rejected() {
        assert!("10.0.0.1/8".parse::<Cidr>().is_err());
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("fd00::/129".parse::<Cidr>().is_err());
        assert_eq!("fd00::1".parse::<Cidr>().unwrap().len, 128);
    }

    #[test]
    fn martian_sources_are_the_unspecified_loopback_multicast_and_reserved_ones() {
        for a in [[0, 0, 0, 0], [0, 1, 2, 3], [127, 0, 0, 1], [224, 0, 0, 1], [239, 9, 9, 9], [240, 0, 0, 1], [255; 4]]
        {
            assert!(V4(a).is_martian_source(), "{a:?}");
        }
        for a in [[1, 0, 0, 0], [10, 0, 0, 1], [126, 255, 255, 255], [128, 0, 0, 1], [223, 255, 255, 255]] {
            assert!(!V4(a).is_martian_source(), "{a:?}");
        }
        let v6 = |s: &str| V6(s.parse::<Ipv6Addr>().unwrap().octets());
        for a in ["::", "::1", "ff02::1", "ff0e::5"] {
            assert!(v6(a).is_martian_source(), "{a}");
        }
        for a in ["::2", "fd00::1", "2001:db8::1", "::ffff:1.2.3.4", "fe80::1"] {
            assert!(!v6(a).is_martian_source(), "{a}");
        }
    }

    #[test]
    fn v4_maps_into_v6_space() {
        assert_eq!(V4([1, 2, 3, 4]).to_mapped()[10..], [0xff, 0xff, 1, 2, 3, 4]);
    }
}
