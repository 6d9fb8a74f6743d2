//! L2 announcement of VIPs: the `l2_addrs` map of the steering program and the frames that
//! announce a take-over.
//!
//! The steering program answers, for every address in its `l2_addrs` map, ARP requests (RFC
//! 826) and Neighbor Solicitations (RFC 4861 §7.2.4) itself, in the driver, with `XDP_TX` and
//! the MAC stored as the entry's value (the MAC of the interface the program is attached to).
//! Frames for other addresses go to the kernel as before. An [`L2Responder`] fills that map and,
//! when this node becomes the owner of an address, tells the segment at once: a gratuitous ARP
//! request ([`gratuitous_arp`], the ARP Announcement of RFC 5227 §2.3) for IPv4, an unsolicited
//! Neighbor Advertisement with the Override flag ([`unsolicited_na`], RFC 4861 §7.2.6) for
//! IPv6, sent from an `AF_PACKET` socket (packet(7)).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, OwnedFd},
};

use aya::maps::{Array, HashMap, MapData, MapError};
use nix::sys::socket::{AddressFamily, LinkAddr, MsgFlags, SockFlag, SockType, sendto, socket};

use crate::{
    NicError,
    filter::{KeyFilter, L2_BITS},
    maps::{addr_bytes, addr_from_bytes, l2_mac_value, l2_self_value},
    steering::{MAP_L2_ADDRS, MAP_L2_FILTER, MAP_L2_SELF, MAX_L2_ADDRS},
};

/// Writes the `l2_addrs` map of one steering program and sends announcements on its interface.
///
/// Made by [`crate::Steering::l2_responder`]; it holds its own file descriptor of the map, so
/// it outlives neither need nor borrow of the [`crate::Steering`] (the map lives while either
/// holds it).
pub struct L2Responder {
    ifname: String,
    ifindex: u32,
    mac: [u8; 6],
    map: HashMap<MapData, [u8; 16], [u8; 8]>,
    /// The program's `l2_filter` array and what it holds (`filter.rs`): one bit per address of
    /// `l2_addrs`, read back whole and rewritten where it differs at every sync.
    filter_map: Array<MapData, u64>,
    filter: KeyFilter,
    /// The program's `l2_self` array (one entry: this MAC, the check flag and whether
    /// `l2_addrs` may hold addresses).
    own: Array<MapData, [u8; 8]>,
    /// The destination MAC check as last set ([`L2Responder::check_destination_mac`]).
    check: bool,
    /// `l2_self`'s `addrs` flag as last written: set before the first address goes into
    /// `l2_addrs`, cleared after the last one left (so the program never skips a lookup that
    /// could find one).
    addrs: bool,
    socket: OwnedFd,
    link: LinkAddr,
}

impl std::fmt::Debug for L2Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L2Responder")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("mac", &self.mac)
            .finish_non_exhaustive()
    }
}

impl L2Responder {
    pub(crate) fn new(
        ifname: &str,
        ifindex: u32,
        map: HashMap<MapData, [u8; 16], [u8; 8]>,
        filter_map: Array<MapData, u64>,
        own: Array<MapData, [u8; 8]>,
    ) -> Result<Self, NicError> {
        let err = |op, source| NicError::Packet { ifname: ifname.to_owned(), op, source };
        // The interface's AF_PACKET address (index and MAC) as getifaddrs(3) reports it: the
        // destination address of sendto(2) on a packet socket.
        let link = nix::ifaddrs::getifaddrs()
            .map_err(|e| err("getifaddrs", e.into()))?
            .filter_map(|a| a.address.and_then(|s| s.as_link_addr().copied()))
            .find(|l| u32::try_from(l.ifindex()).ok() == Some(ifindex))
            .ok_or_else(|| err("getifaddrs", std::io::Error::other(format!("no link address for index {ifindex}"))))?;
        let mac = link
            .addr()
            .ok_or_else(|| err("getifaddrs", std::io::Error::other("the interface has no MAC (not Ethernet)")))?;
        // Protocol 0: the socket sends only and never receives a frame.
        let socket = socket(AddressFamily::Packet, SockType::Raw, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| err("socket", e.into()))?;
        // Whatever a previous responder of this program left: `addrs` set until a sync says.
        let filter = KeyFilter::new(L2_BITS);
        let mut me = Self {
            ifname: ifname.to_owned(),
            ifindex,
            mac,
            map,
            filter_map,
            filter,
            own,
            check: false,
            addrs: true,
            socket,
            link,
        };
        if let Ok(v) = me.own.get(&0, 0) {
            me.check = v[6] != 0;
        }
        me.write_self()?;
        Ok(me)
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The MAC the program answers with (the interface's, read when the responder was made).
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Makes the `l2_addrs` map hold exactly `addrs`, each with this interface's MAC: from
    /// now on the program answers ARP (IPv4) and Neighbor Solicitations (IPv6) for them, and
    /// drops what is sent to them outside their service ports. Compares with the kernel's map
    /// (a full pass; the set is small and changes rarely).
    ///
    /// # Errors
    /// [`NicError::InvalidArgument`] for more than [`MAX_L2_ADDRS`] addresses (the map is then
    /// unchanged), [`NicError::Map`] if the kernel refuses.
    pub fn sync(&mut self, addrs: &[IpAddr]) -> Result<(), NicError> {
        if addrs.len() > MAX_L2_ADDRS {
            return Err(NicError::InvalidArgument {
                field: MAP_L2_ADDRS,
                reason: format!("{} entries exceed the map's capacity of {MAX_L2_ADDRS}", addrs.len()),
            });
        }
        let value = l2_mac_value(self.mac);
        let want: std::collections::HashSet<[u8; 16]> = addrs.iter().map(|a| addr_bytes(*a)).collect();
        if !want.is_empty() && !self.addrs {
            self.addrs = true;
            self.write_self()?;
        }
        let merr = |op, e| NicError::map(&self.ifname, MAP_L2_ADDRS, op, e);
        let have: Vec<[u8; 16]> = self.map.keys().collect::<Result<_, _>>().map_err(|e| merr("iterate keys", e))?;
        for k in have.iter().filter(|k| !want.contains(*k)) {
            match self.map.remove(k) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(nix::libc::ENOENT) => {}
                Err(e) => return Err(merr("delete", e)),
            }
        }
        for k in &want {
            if self.map.get(k, 0).ok() != Some(value) {
                self.map.insert(k, value, 0).map_err(|e| merr("insert", e))?;
            }
        }
        // The filter after the map (an address being added is not dropped by the program
        // until its bit is set; a removed one is looked up until its bit is cleared), and
        // compared with the kernel's words like the map.
        let fmap = &mut self.filter_map;
        self.filter.reload(0, self.filter.len(), |i| fmap.get(&i, 0).ok());
        self.filter
            .apply(want.iter().map(|a| (*a, 0)), |i, v| fmap.set(i, v, 0))
            .map_err(|e| NicError::map(&self.ifname, MAP_L2_FILTER, "update", e))?;
        if want.is_empty() && self.addrs {
            self.addrs = false;
            self.write_self()?;
        }
        Ok(())
    }

    /// Writes `l2_self` from this responder's MAC, check flag and `addrs` flag.
    fn write_self(&mut self) -> Result<(), NicError> {
        self.own
            .set(0, l2_self_value(self.mac, self.check, self.addrs), 0)
            .map_err(|e| NicError::map(&self.ifname, MAP_L2_SELF, "update", e))
    }

    /// Turns the program's destination MAC check on or off (`l2_self`). On: a unicast frame
    /// addressed to another MAC than this interface's is given to the kernel (which drops it
    /// as another host's, counted [`crate::SteeringStats::l2_other_host`]) before anything
    /// else, so a frame that a switch floods for another node's MAC (unknown to the switch) is
    /// never forwarded by this node. For L2 mode, where a VIP's traffic is sent to its owner's
    /// MAC; broadcast and multicast frames are not affected. Off (the program's default): the
    /// program takes frames whatever their destination MAC.
    ///
    /// # Errors
    /// [`NicError::Map`] if the kernel refuses the write.
    pub fn check_destination_mac(&mut self, on: bool) -> Result<(), NicError> {
        self.check = on;
        self.write_self()
    }

    /// The addresses in the map, in no order.
    ///
    /// # Errors
    /// [`NicError::Map`] if iterating fails.
    pub fn addrs(&self) -> Result<Vec<IpAddr>, NicError> {
        self.map
            .keys()
            .map(|k| k.map(addr_from_bytes).map_err(|e| NicError::map(&self.ifname, MAP_L2_ADDRS, "iterate keys", e)))
            .collect()
    }

    /// Tells the segment that `addr` is now at this interface's MAC: one gratuitous ARP request
    /// ([`gratuitous_arp`]) or unsolicited Neighbor Advertisement ([`unsolicited_na`]).
    ///
    /// # Errors
    /// [`NicError::Packet`] if sending fails.
    pub fn announce(&self, addr: IpAddr) -> Result<(), NicError> {
        let frame: Vec<u8> = match addr {
            IpAddr::V4(a) => gratuitous_arp(self.mac, a).to_vec(),
            IpAddr::V6(a) => unsolicited_na(self.mac, a).to_vec(),
        };
        sendto(self.socket.as_raw_fd(), &frame, &self.link, MsgFlags::empty()).map_err(|e| NicError::Packet {
            ifname: self.ifname.clone(),
            op: "sendto",
            source: e.into(),
        })?;
        Ok(())
    }
}

/// A gratuitous ARP request announcing `addr` at `mac` (RFC 5227 §2.3, ARP Announcement; RFC
/// 826 layout): Ethernet broadcast, opcode 1, sender and target protocol address both `addr`,
/// target hardware address zero. 42 bytes (no padding: the driver pads to 60). Receivers that
/// have an entry for `addr` update it to `mac`.
#[must_use]
pub fn gratuitous_arp(mac: [u8; 6], addr: Ipv4Addr) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes()); // htype Ethernet
    f[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // ptype IPv4
    f[18] = 6;
    f[19] = 4;
    f[20..22].copy_from_slice(&1u16.to_be_bytes()); // request
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&addr.octets());
    // tha stays zero
    f[38..42].copy_from_slice(&addr.octets());
    f
}

/// An unsolicited Neighbor Advertisement for `addr` at `mac` (RFC 4861 §7.2.6): from `addr`
/// to the all-nodes address `ff02::1` (Ethernet `33:33:00:00:00:01`, RFC 2464 §7), hop limit
/// 255, flags Override only, with the Target Link-Layer Address option. 86 bytes. Receivers
/// that have an entry for `addr` take the new MAC (and mark it STALE, §7.2.5).
#[must_use]
pub fn unsolicited_na(mac: [u8; 6], addr: Ipv6Addr) -> [u8; 86] {
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    let mut f = [0u8; 86];
    f[0..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    let ip = &mut f[14..54];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&32u16.to_be_bytes());
    ip[6] = 58;
    ip[7] = 255;
    ip[8..24].copy_from_slice(&addr.octets());
    ip[24..40].copy_from_slice(&all_nodes.octets());
    let icmp = &mut f[54..86];
    icmp[0] = 136;
    icmp[4] = 0x20; // O
    icmp[8..24].copy_from_slice(&addr.octets());
    icmp[24] = 2; // Target Link-Layer Address
    icmp[25] = 1;
    icmp[26..32].copy_from_slice(&mac);
    let sum = icmpv6_checksum(addr, all_nodes, &f[54..86]);
    f[56..58].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The ICMPv6 checksum (RFC 4443 §2.3) of `msg` (its checksum field zero) from `src` to `dst`:
/// one's complement sum over the pseudo-header of RFC 8200 §8.1 and the message.
#[must_use]
pub(crate) fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(msg);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];

    #[test]
    fn gratuitous_arp_is_a_request_with_sender_and_target_the_vip() {
        let f = gratuitous_arp(MAC, Ipv4Addr::new(192, 0, 2, 10));
        assert_eq!(&f[0..6], &[0xff; 6], "broadcast");
        assert_eq!(&f[6..12], &MAC);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1], "opcode request");
        assert_eq!(&f[22..28], &MAC, "sender hardware address");
        assert_eq!(&f[28..32], &[192, 0, 2, 10], "sender protocol address");
        assert_eq!(&f[32..38], &[0; 6], "target hardware address zero");
        assert_eq!(&f[38..42], &[192, 0, 2, 10], "target protocol address");
    }

    #[test]
    fn unsolicited_na_checksums_to_zero_and_sets_only_override() {
        let vip: Ipv6Addr = "2001:db8::10".parse().unwrap();
        let f = unsolicited_na(MAC, vip);
        assert_eq!(&f[0..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(f[14 + 7], 255, "hop limit 255 (RFC 4861 7.1.2)");
        assert_eq!(f[54], 136);
        assert_eq!(f[58], 0x20, "O set, S and R clear");
        assert_eq!(&f[80..86], &MAC);
        // A correct checksum makes the sum over pseudo-header and message (checksum included)
        // fold to 0xffff, i.e. recomputing over the finished message gives 0.
        let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
        assert_eq!(icmpv6_checksum(vip, all_nodes, &f[54..86]), 0);
    }

    #[test]
    fn checksum_matches_a_known_value() {
        // RFC 1071 example bytes, no pseudo-header contribution besides the fixed fields.
        let zero = Ipv6Addr::UNSPECIFIED;
        let c = icmpv6_checksum(zero, zero, &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]);
        // Sum 0x0001+0xf203+0xf4f5+0xf6f7 = 0x2ddf0 -> 0xddf2, plus length 8 and next header 58
        // = 0xde34; complement 0x21cb.
        assert_eq!(c, 0x21cb);
    }
}
