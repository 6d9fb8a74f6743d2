//! The kernel's unicast routes (`RTM_GETROUTE`, rtnetlink(7)), for next hops that are not on
//! the attached link: pod CIDRs routed via other nodes, gateways, multipath routes.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_DUMP, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteNextHopFlags, RouteType, RouteVia},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::{NicError, nl::RouteSocket};

/// `RTNLGRP_IPV4_ROUTE` and `RTNLGRP_IPV6_ROUTE` from `enum rtnetlink_groups` in
/// `include/uapi/linux/rtnetlink.h`.
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// Route change notifications (`RTM_NEWROUTE` / `RTM_DELROUTE` multicast, rtnetlink(7)) of
/// the calling thread's network namespace: tells that the routes changed, not how; reread
/// them with [`routes`].
pub struct RouteWatcher {
    sock: Socket,
}

impl std::fmt::Debug for RouteWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteWatcher")
    }
}

impl RouteWatcher {
    /// Opens a non-blocking `NETLINK_ROUTE` socket joined to the IPv4 and IPv6 route groups.
    ///
    /// # Errors
    /// [`NicError::Netlink`] if the socket cannot be created, bound or joined.
    pub fn new() -> Result<Self, NicError> {
        const OP: &str = "RTNLGRP_IPV4_ROUTE/RTNLGRP_IPV6_ROUTE subscribe";
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| NicError::netlink(OP, e))?;
        sock.bind(&SocketAddr::new(0, 0)).map_err(|e| NicError::netlink(OP, e))?;
        for g in [RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE] {
            sock.add_membership(g).map_err(|e| NicError::netlink(OP, e))?;
        }
        sock.set_non_blocking(true).map_err(|e| NicError::netlink(OP, e))?;
        // Room for bursts (a routing daemon installing thousands of routes) before ENOBUFS.
        let _ = sock.set_rx_buf_sz(4 * 1024 * 1024);
        Ok(Self { sock })
    }

    /// Reads every notification queued so far without waiting; `true` if a route was added,
    /// changed or removed since the last call (or notifications were lost to an overflow, so
    /// the caller must reread anyway).
    ///
    /// # Errors
    /// [`NicError::Netlink`] if the socket fails for another reason than having nothing to read.
    pub fn changed(&mut self) -> Result<bool, NicError> {
        const OP: &str = "RTNLGRP_IPV4_ROUTE receive";
        let mut changed = false;
        loop {
            let data = match self.sock.recv_from_full() {
                Ok((data, _)) => data,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(changed),
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {
                    changed = true;
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NicError::netlink(OP, e)),
            };
            let mut offset = 0;
            while offset < data.len() {
                let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..]) else {
                    // Undecodable: count it as a change, the reread decides.
                    changed = true;
                    break;
                };
                let len = usize::try_from(msg.header.length).unwrap_or(usize::MAX);
                if len == 0 {
                    break;
                }
                offset += len.next_multiple_of(4);
                changed |= matches!(
                    msg.payload,
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(_) | RouteNetlinkMessage::DelRoute(_))
                        | NetlinkPayload::Overrun(_)
                );
            }
        }
    }
}

/// `RT_TABLE_MAIN` (rtnetlink(7)): the table `ip route` shows by default.
pub const TABLE_MAIN: u32 = 254;

/// One unicast route of a routing table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelRoute {
    /// Destination network address (`RTA_DST`; `0.0.0.0` / `::` for a default route).
    pub dst: IpAddr,
    /// Destination prefix length in bits (`rtm_dst_len`).
    pub prefix_len: u8,
    /// Gateways (`RTA_GATEWAY`, or `RTA_VIA` for a next hop of the other family, RFC 5549 as
    /// FRR installs it for BGP unnumbered; or each live next hop's of `RTA_MULTIPATH`, in the
    /// kernel's order, those marked `RTNH_F_DEAD` left out as the kernel's
    /// `fib_select_multipath` leaves them); empty for a route to a directly connected network
    /// (on-link). A multipath route whose every next hop is dead is not listed.
    pub gateways: Vec<IpAddr>,
    /// Output interface index (`RTA_OIF`; for a multipath route, the first live next hop's).
    pub oif: Option<u32>,
    /// Route metric (`RTA_PRIORITY`, 0 if absent): of two routes to the same prefix the kernel
    /// uses the lower one.
    pub metric: u32,
}

/// The gateway a route attribute names: `RTA_GATEWAY`, or `RTA_VIA` (a gateway of either
/// family, rtnetlink(7)).
fn gateway_of(a: &RouteAttribute) -> Option<IpAddr> {
    match a {
        RouteAttribute::Gateway(g) => ip_of(g),
        RouteAttribute::Via(RouteVia::Inet(v4)) => Some(IpAddr::V4(*v4)),
        RouteAttribute::Via(RouteVia::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The unicast routes of routing table `table` (e.g. [`TABLE_MAIN`]), IPv4 and IPv6, in the
/// calling thread's network namespace. Local, broadcast, blackhole, unreachable and other
/// non-unicast routes are left out, as are routes with a source prefix (policy routes).
///
/// # Errors
/// [`NicError::Netlink`] if the dump fails.
pub fn routes(table: u32) -> Result<Vec<KernelRoute>, NicError> {
    const OP: &str = "RTM_GETROUTE dump";
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        let mut sock = RouteSocket::new(OP)?;
        for m in sock.request(OP, RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP)? {
            let RouteNetlinkMessage::NewRoute(r) = m else { continue };
            if let Some(k) = from_message(&r, table) {
                out.push(k);
            }
        }
    }
    Ok(out)
}

/// A [`KernelRoute`] from an `RTM_NEWROUTE` message, if it is a unicast route of `table`.
fn from_message(r: &RouteMessage, table: u32) -> Option<KernelRoute> {
    if r.header.kind != RouteType::Unicast || r.header.source_prefix_length != 0 {
        return None;
    }
    // The 8-bit `rtm_table` holds tables below 256; RTA_TABLE holds any.
    let t = r
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table));
    if t != table {
        return None;
    }
    let unspecified = match r.header.address_family {
        AddressFamily::Inet => IpAddr::from([0u8; 4]),
        AddressFamily::Inet6 => IpAddr::from([0u8; 16]),
        _ => return None,
    };
    let mut route = KernelRoute {
        dst: unspecified,
        prefix_len: r.header.destination_prefix_length,
        gateways: Vec::new(),
        oif: None,
        metric: 0,
    };
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => route.dst = ip_of(d)?,
            RouteAttribute::Gateway(_) | RouteAttribute::Via(_) => route.gateways.extend(gateway_of(a)),
            RouteAttribute::Oif(i) => route.oif = Some(*i),
            RouteAttribute::Priority(p) => route.metric = *p,
            RouteAttribute::MultiPath(hops) => {
                let live: Vec<_> = hops.iter().filter(|h| !h.flags.contains(RouteNextHopFlags::Dead)).collect();
                if live.is_empty() && !hops.is_empty() {
                    // No next hop the kernel would choose: not a route to send through (and
                    // not an on-link one either).
                    return None;
                }
                for h in live {
                    route.oif = route.oif.or(Some(h.interface_index));
                    route.gateways.extend(h.attributes.iter().filter_map(gateway_of));
                }
            }
            _ => {}
        }
    }
    Some(route)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use netlink_packet_route::route::RouteNextHop;

    /// A unicast route of main to `dst`/24 with `attributes` after its table and destination.
    fn route_to(dst: &str, attributes: Vec<RouteAttribute>) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.destination_prefix_length = 24;
        m.header.table = 254;
        m.header.kind = RouteType::Unicast;
        m.attributes =
            vec![RouteAttribute::Table(254), RouteAttribute::Destination(RouteAddress::Inet(dst.parse().unwrap()))];
        m.attributes.extend(attributes);
        m
    }

    fn hop(oif: u32, flags: RouteNextHopFlags, gw: RouteAttribute) -> RouteNextHop {
        let mut h = RouteNextHop::default();
        h.interface_index = oif;
        h.flags = flags;
        h.attributes = vec![gw];
        h
    }

    /// An IPv4 route to a pod CIDR through an IPv6 link-local next hop (RFC 5549, BGP
    /// unnumbered, as FRR installs it: `ip route add 10.244.1.0/24 via inet6 fe80::1 dev eth0`):
    /// the kernel gives the gateway in `RTA_VIA`, not `RTA_GATEWAY`. It is not on-link.
    #[test]
    fn an_ipv4_route_via_an_ipv6_next_hop_keeps_its_gateway() {
        let via = |gw: &str| RouteAttribute::Via(RouteVia::Inet6(gw.parse().unwrap()));
        let m = route_to("10.244.1.0", vec![via("fe80::1"), RouteAttribute::Oif(2)]);
        let r = from_message(&m, TABLE_MAIN).expect("a unicast route of main");
        assert_eq!(r.gateways, vec!["fe80::1".parse::<IpAddr>().unwrap()], "{r:?} read as on-link");
        // The same in each next hop of a multipath route.
        let hops = vec![
            hop(2, RouteNextHopFlags::empty(), via("fe80::1")),
            hop(3, RouteNextHopFlags::empty(), via("fe80::2")),
        ];
        let r = from_message(&route_to("10.244.1.0", vec![RouteAttribute::MultiPath(hops)]), TABLE_MAIN).unwrap();
        assert_eq!(r.gateways.len(), 2, "{r:?} read as on-link");
    }

    /// A multipath route one of whose next hops is dead (its interface went down: the kernel
    /// keeps the route, marks the hop `RTNH_F_DEAD | RTNH_F_LINKDOWN` and no longer selects it,
    /// `fib_select_multipath`): its gateway is not one to send through, nor its interface the
    /// route's. With every hop dead the route is not listed at all (not read as on-link).
    #[test]
    fn a_dead_next_hop_of_a_multipath_route_is_not_a_gateway() {
        let gw = |a: &str| RouteAttribute::Gateway(RouteAddress::Inet(a.parse().unwrap()));
        let dead = RouteNextHopFlags::Dead | RouteNextHopFlags::Linkdown;
        let hops = vec![hop(2, dead, gw("192.168.1.1")), hop(3, RouteNextHopFlags::empty(), gw("192.168.2.1"))];
        let r = from_message(&route_to("10.244.2.0", vec![RouteAttribute::MultiPath(hops)]), TABLE_MAIN).unwrap();
        assert_eq!((r.gateways, r.oif), (vec!["192.168.2.1".parse::<IpAddr>().unwrap()], Some(3)));
        let all_dead = vec![hop(2, dead, gw("192.168.1.1")), hop(3, dead, gw("192.168.2.1"))];
        assert_eq!(from_message(&route_to("10.244.2.0", vec![RouteAttribute::MultiPath(all_dead)]), TABLE_MAIN), None);
    }
}
