//! Byte layouts of the steering program's maps, shared with `xdp/steer.c`.
//!
//! Every layout is `#[repr(C)]` and padding-free on purpose: the kernel compares hash keys
//! byte by byte, so padding with stray bytes would make lookups miss. The C side checks the sizes
//! with `_Static_assert`, this side with `const` assertions. aya reads and writes map entries as
//! plain byte images ([`aya::Pod`]); to stay free of `unsafe`, the keys travel as byte arrays
//! produced by the `to_bytes` methods below.
//!
//! The per-packet lookups of IPv4 frames use maps of their own with short keys (`services4`,
//! `endpoints4`: [`Service4MapKey`], 8 bytes; `snat4`: the 4-byte address), which the kernel
//! hashes and compares faster than the 20-byte form. Elsewhere addresses are 16 bytes: IPv6 as
//! is, IPv4 as the IPv4-mapped IPv6 address `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2), so one map
//! serves both families (`vip_addrs`, `l2_addrs`).

use std::net::{IpAddr, Ipv4Addr};

use crate::NicError;

/// IANA protocol number of TCP (RFC 9293).
pub const IPPROTO_TCP: u8 = 6;
/// IANA protocol number of UDP (RFC 768).
pub const IPPROTO_UDP: u8 = 17;
/// IANA protocol number of SCTP (RFC 9260).
pub const IPPROTO_SCTP: u8 = 132;

/// A service the steering program sends to xlb: destination address, L4 protocol and
/// destination port of the frames to redirect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Destination address (a VIP, a node address for NodePort, a LoadBalancer ingress IP).
    pub addr: IpAddr,
    /// L4 protocol number: [`IPPROTO_TCP`], [`IPPROTO_UDP`] or [`IPPROTO_SCTP`].
    pub proto: u8,
    /// Destination port, host byte order.
    pub port: u16,
}

/// Key of the `services` map, as the C program sees it (`struct service_key`, 20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ServiceMapKey {
    /// Destination address, see the module docs.
    pub(crate) addr: [u8; 16],
    /// Destination port, network byte order.
    pub(crate) port_be: [u8; 2],
    /// L4 protocol number.
    pub(crate) proto: u8,
    /// Always 0.
    pub(crate) pad: u8,
}

const _: () = assert!(size_of::<ServiceMapKey>() == 20, "struct service_key is 20 bytes");
const _: () = assert!(align_of::<ServiceMapKey>() == 1, "no padding possible");

impl ServiceMapKey {
    pub(crate) const LEN: usize = 20;

    pub(crate) fn to_bytes(self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..16].copy_from_slice(&self.addr);
        b[16..18].copy_from_slice(&self.port_be);
        b[18] = self.proto;
        b[19] = self.pad;
        b
    }

    pub(crate) fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let mut addr = [0u8; 16];
        addr.copy_from_slice(&b[..16]);
        Self { addr, port_be: [b[16], b[17]], proto: b[18], pad: b[19] }
    }

    pub(crate) fn to_service_key(self) -> ServiceKey {
        ServiceKey { addr: addr_from_bytes(self.addr), proto: self.proto, port: u16::from_be_bytes(self.port_be) }
    }
}

impl TryFrom<&ServiceKey> for ServiceMapKey {
    type Error = NicError;

    fn try_from(k: &ServiceKey) -> Result<Self, NicError> {
        if !matches!(k.proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP) {
            return Err(NicError::InvalidArgument {
                field: "ServiceKey.proto",
                reason: format!("{} for {}:{} is not TCP (6), UDP (17) or SCTP (132)", k.proto, k.addr, k.port),
            });
        }
        Ok(Self { addr: addr_bytes(k.addr), port_be: k.port.to_be_bytes(), proto: k.proto, pad: 0 })
    }
}

/// Key of the `services4` and `endpoints4` maps (`struct service4_key`, 8 bytes): the IPv4
/// form of [`ServiceMapKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Service4MapKey {
    /// IPv4 address, network byte order.
    pub(crate) addr: [u8; 4],
    /// Port, network byte order.
    pub(crate) port_be: [u8; 2],
    /// L4 protocol number.
    pub(crate) proto: u8,
    /// Always 0.
    pub(crate) pad: u8,
}

const _: () = assert!(size_of::<Service4MapKey>() == 8, "struct service4_key is 8 bytes");
const _: () = assert!(align_of::<Service4MapKey>() == 1, "no padding possible");

impl Service4MapKey {
    pub(crate) const LEN: usize = 8;

    pub(crate) fn to_bytes(self) -> [u8; Self::LEN] {
        let [a, b, c, d] = self.addr;
        let [p, q] = self.port_be;
        [a, b, c, d, p, q, self.proto, self.pad]
    }

    pub(crate) fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let [a, b, c, d, p, q, proto, pad] = *b;
        Self { addr: [a, b, c, d], port_be: [p, q], proto, pad }
    }

    pub(crate) fn to_service_key(self) -> ServiceKey {
        ServiceKey {
            addr: IpAddr::V4(Ipv4Addr::from(self.addr)),
            proto: self.proto,
            port: u16::from_be_bytes(self.port_be),
        }
    }
}

/// A [`ServiceKey`] in the byte form of the map of its family: `services4`/`endpoints4` for
/// IPv4 (an IPv4-mapped IPv6 address counts as IPv4, as the program sees such frames), else
/// `services`/`endpoints`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FamilyKey {
    /// [`Service4MapKey::to_bytes`].
    V4([u8; Service4MapKey::LEN]),
    /// [`ServiceMapKey::to_bytes`].
    V6([u8; ServiceMapKey::LEN]),
}

impl TryFrom<&ServiceKey> for FamilyKey {
    type Error = NicError;

    /// # Errors
    /// [`NicError::InvalidArgument`] naming `ServiceKey.proto` for a protocol other than TCP,
    /// UDP or SCTP.
    fn try_from(k: &ServiceKey) -> Result<Self, NicError> {
        let full = ServiceMapKey::try_from(k)?;
        Ok(match ipv4_of(k.addr) {
            Some(a) => Self::V4(
                Service4MapKey { addr: a.octets(), port_be: full.port_be, proto: full.proto, pad: 0 }.to_bytes(),
            ),
            None => Self::V6(full.to_bytes()),
        })
    }
}

/// The IPv4 address of `addr` if it is one: IPv4, or IPv6 in the IPv4-mapped form.
#[must_use]
pub(crate) fn ipv4_of(addr: IpAddr) -> Option<Ipv4Addr> {
    match addr {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    }
}

/// Value of the `snat4` and `snat_addrs` maps (`struct snat_range`, 4 bytes): an inclusive port
/// range in host byte order. aya stores it as the identical `[u16; 2]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnatRange {
    pub(crate) port_min: u16,
    pub(crate) port_max: u16,
}

const _: () = assert!(size_of::<SnatRange>() == 4, "struct snat_range is 4 bytes");

impl SnatRange {
    pub(crate) fn to_array(self) -> [u16; 2] {
        [self.port_min, self.port_max]
    }
}

/// Value of the `l2_addrs` map (`struct l2_mac`, 8 bytes): the MAC the program answers ARP
/// and Neighbor Solicitations with, then two zero bytes.
#[must_use]
pub(crate) fn l2_mac_value(mac: [u8; 6]) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..6].copy_from_slice(&mac);
    v
}

/// Value of the `l2_self` array's one entry (`struct l2_self`, 8 bytes): the interface's MAC,
/// then 1 to make the program pass unicast frames addressed to another MAC (0: no check), then
/// 1 when `l2_addrs` may hold addresses (0: it is empty, and the program skips its lookup for
/// the frames it passes).
#[must_use]
pub(crate) fn l2_self_value(mac: [u8; 6], check: bool, addrs: bool) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..6].copy_from_slice(&mac);
    v[6] = u8::from(check);
    v[7] = u8::from(addrs);
    v
}

/// Indexes of the per-CPU `stats` array (`enum` in `xdp/steer.c`).
pub(crate) mod stat {
    pub(crate) const REDIRECTED: u32 = 0;
    pub(crate) const PASSED: u32 = 1;
    pub(crate) const REDIRECT_FAILED: u32 = 2;
    pub(crate) const PARSE_ERROR: u32 = 3;
    pub(crate) const L2_REPLIED: u32 = 4;
    pub(crate) const L2_DROPPED: u32 = 5;
    pub(crate) const L2_OTHER_HOST: u32 = 6;
}

/// The 16-byte map form of an address: IPv6 as is, IPv4 as `::ffff:a.b.c.d`.
#[must_use]
pub(crate) fn addr_bytes(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The inverse of [`addr_bytes`]: `::ffff:a.b.c.d` becomes IPv4.
#[must_use]
pub(crate) fn addr_from_bytes(b: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(b);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_key_bytes_match_the_c_layout() {
        let k = ServiceKey { addr: "10.1.2.3".parse().unwrap(), proto: IPPROTO_UDP, port: 0x1234 };
        let b = ServiceMapKey::try_from(&k).unwrap().to_bytes();
        assert_eq!(&b[..10], &[0; 10]);
        assert_eq!(&b[10..16], &[0xff, 0xff, 10, 1, 2, 3]);
        assert_eq!(&b[16..18], &[0x12, 0x34], "port in network order");
        assert_eq!(b[18], 17);
        assert_eq!(b[19], 0);
        assert_eq!(ServiceMapKey::from_bytes(&b).to_service_key(), k, "round trip");
    }

    #[test]
    fn ipv4_service_keys_take_the_8_byte_c_layout_and_mapped_ones_count_as_ipv4() {
        let k = ServiceKey { addr: "10.1.2.3".parse().unwrap(), proto: IPPROTO_TCP, port: 0x1234 };
        let FamilyKey::V4(b) = FamilyKey::try_from(&k).unwrap() else { panic!("IPv4 key in the IPv6 map") };
        assert_eq!(b, [10, 1, 2, 3, 0x12, 0x34, 6, 0], "address and port in network order, then proto, pad");
        assert_eq!(Service4MapKey::from_bytes(&b).to_service_key(), k, "round trip");
        let mapped = ServiceKey { addr: "::ffff:10.1.2.3".parse().unwrap(), ..k };
        assert_eq!(FamilyKey::try_from(&mapped).unwrap(), FamilyKey::V4(b));
        let v6 = ServiceKey { addr: "fd00::1".parse().unwrap(), ..k };
        assert!(matches!(FamilyKey::try_from(&v6).unwrap(), FamilyKey::V6(_)));
        let bad = ServiceKey { proto: 1, ..k };
        assert!(FamilyKey::try_from(&bad).unwrap_err().to_string().contains("ServiceKey.proto"));
    }

    #[test]
    fn ipv6_addresses_are_kept_verbatim() {
        let a: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(addr_bytes(a)[0], 0xfd);
        assert_eq!(addr_bytes(a)[15], 1);
    }

    #[test]
    fn unknown_protocols_are_rejected_naming_the_field() {
        let k = ServiceKey { addr: "10.0.0.1".parse().unwrap(), proto: 1, port: 80 };
        let e = ServiceMapKey::try_from(&k).unwrap_err();
        assert!(e.to_string().contains("ServiceKey.proto"), "{e}");
    }
}
