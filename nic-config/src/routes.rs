//! The kernel's unicast routes (`RTM_GETROUTE`, rtnetlink(7)), for next hops that are not on
//! the attached link: pod CIDRs routed via other nodes, gateways, multipath routes.

use std::net::IpAddr;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
};

use crate::{NicError, nl::RouteSocket};

/// `RT_TABLE_MAIN` (rtnetlink(7)): the table `ip route` shows by default.
pub const TABLE_MAIN: u32 = 254;

/// One unicast route of a routing table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelRoute {
    /// Destination network address (`RTA_DST`; `0.0.0.0` / `::` for a default route).
    pub dst: IpAddr,
    /// Destination prefix length in bits (`rtm_dst_len`).
    pub prefix_len: u8,
    /// Gateways (`RTA_GATEWAY`, or each next hop's of `RTA_MULTIPATH`, in the kernel's
    /// order); empty for a route to a directly connected network (on-link).
    pub gateways: Vec<IpAddr>,
    /// Output interface index (`RTA_OIF`; for a multipath route, the first next hop's).
    pub oif: Option<u32>,
    /// Route metric (`RTA_PRIORITY`, 0 if absent): of two routes to the same prefix the kernel
    /// uses the lower one.
    pub metric: u32,
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
            RouteAttribute::Gateway(g) => route.gateways.extend(ip_of(g)),
            RouteAttribute::Oif(i) => route.oif = Some(*i),
            RouteAttribute::Priority(p) => route.metric = *p,
            RouteAttribute::MultiPath(hops) => {
                for h in hops {
                    route.oif = route.oif.or(Some(h.interface_index));
                    for x in &h.attributes {
                        if let RouteAttribute::Gateway(g) = x {
                            route.gateways.extend(ip_of(g));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Some(route)
}
