//! Policy routing for backends reached through the kernel (pods behind a veth on xlb's own
//! node): their replies must come back through xlb so the client sees the VIP, but the
//! kernel would route them straight out of the NIC. One rule per backend (source address, IP
//! protocol, source port), `ip rule add pref 100 from POD ipproto tcp sport 80 lookup
//! 7892066`, sends them to a table whose only routes are default routes into the punt device,
//! where the workers read them (ip-rule(8); `FRA_IP_PROTO` and `FRA_SPORT_RANGE` need Linux
//! 4.17). A rule left behind by a killed xlb is harmless: once the punt device is gone the
//! table is empty and the lookup falls through to the next rule (main). Packets coming out of
//! the punt device skip these rules ([`set_bypass`]), so what xlb hands back to the kernel is
//! routed by the main table and never returns into the device.

use std::collections::BTreeSet;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::{
    AddressFamily, IpProtocol, RouteNetlinkMessage,
    route::{RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType},
    rule::{RuleAction, RuleAttribute, RuleMessage, RulePortRange},
};

use crate::{NicError, nl::RouteSocket};

/// The routing table xlb's reply rules point at (`0x786c62`, "xlb" in ASCII).
pub const REPLY_TABLE: u32 = 0x0078_6c62;
/// Priority of xlb's reply rules: before `main` (32766), after `local` (0).
pub const REPLY_RULE_PRIORITY: u32 = 100;

/// Priority of the rule that sends whatever comes *out of* the punt device to the main table,
/// ahead of the reply rules: a packet xlb hands back to the kernel (a pod's packet that was
/// not a reply of one of xlb's flows) must not be routed into the device again.
pub const BYPASS_RULE_PRIORITY: u32 = 99;

fn bypass_message(ifname: &str, fam: AddressFamily) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = fam;
    m.header.action = RuleAction::ToTable;
    m.attributes = vec![
        RuleAttribute::Iifname(ifname.to_owned()),
        RuleAttribute::Priority(BYPASS_RULE_PRIORITY),
        RuleAttribute::Table(crate::routes::TABLE_MAIN),
    ];
    m
}

/// Adds (`on`) or removes the rules `pref 99 iif IFNAME lookup main` (IPv4 and IPv6): packets
/// received on the punt device `ifname` skip the reply rules. Adding an existing rule and
/// removing a missing one are not errors.
///
/// # Errors
/// [`NicError::Netlink`] if the kernel refuses otherwise.
pub fn set_bypass(ifname: &str, on: bool) -> Result<(), NicError> {
    let op = if on { "RTM_NEWRULE" } else { "RTM_DELRULE" };
    let mut sock = RouteSocket::new(op)?;
    for fam in [AddressFamily::Inet, AddressFamily::Inet6] {
        let m = bypass_message(ifname, fam);
        let r = if on {
            sock.request(op, RouteNetlinkMessage::NewRule(m), NLM_F_CREATE | NLM_F_EXCL)
        } else {
            sock.request(op, RouteNetlinkMessage::DelRule(m), 0)
        };
        match r {
            Ok(_) => {}
            Err(NicError::Netlink { source, .. })
                if source.raw_os_error() == Some(if on { nix::libc::EEXIST } else { nix::libc::ENOENT }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The devices named by bypass rules now in the kernel (`pref 99 iif IFNAME lookup main`, as
/// [`set_bypass`] adds them), either family.
///
/// # Errors
/// [`NicError::Netlink`] if the `RTM_GETRULE` dump fails.
pub fn bypass_devices() -> Result<BTreeSet<String>, NicError> {
    let mut out = BTreeSet::new();
    for r in dump_rules()? {
        let (mut iif, mut prio, mut table) = (None, None, None);
        for a in r.attributes {
            match a {
                RuleAttribute::Iifname(n) => iif = Some(n),
                RuleAttribute::Priority(p) => prio = Some(p),
                RuleAttribute::Table(t) => table = Some(t),
                _ => {}
            }
        }
        if prio == Some(BYPASS_RULE_PRIORITY)
            && table == Some(crate::routes::TABLE_MAIN)
            && let Some(iif) = iif
        {
            out.insert(iif);
        }
    }
    Ok(out)
}

/// Removes what an earlier xlb's punt device left in the rules once this process owns them
/// (after a hand-over, or at the start after a crash): the bypass rules of every device but
/// `punt` and, when this process has no punt device (`punt` is `None`), every reply rule.
/// Returns (bypass devices, reply rules) removed. Harmless when nothing is left.
///
/// # Errors
/// [`NicError::Netlink`] naming the request that failed; what was removed before it stays
/// removed.
pub fn remove_leftovers(punt: Option<&str>) -> Result<(usize, usize), NicError> {
    let mut devices = 0;
    for dev in bypass_devices()? {
        if Some(dev.as_str()) != punt {
            set_bypass(&dev, false)?;
            devices += 1;
        }
    }
    let replies = if punt.is_none() { sync_reply_rules(&BTreeSet::new())?.1 } else { 0 };
    Ok((devices, replies))
}

/// Replies from this (source address, IP protocol, source port) are routed into the punt device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplyRule {
    /// The backend's address.
    pub src: IpAddr,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP).
    pub proto: u8,
    /// The backend's port (the Service's target port).
    pub sport: u16,
}

fn family(a: IpAddr) -> AddressFamily {
    if a.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 }
}

fn message(r: &ReplyRule) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = family(r.src);
    m.header.src_len = if r.src.is_ipv4() { 32 } else { 128 };
    m.header.action = RuleAction::ToTable;
    m.attributes = vec![
        RuleAttribute::Source(r.src),
        RuleAttribute::Priority(REPLY_RULE_PRIORITY),
        RuleAttribute::Table(REPLY_TABLE),
        RuleAttribute::IpProtocol(IpProtocol::from(r.proto)),
        RuleAttribute::SourcePortRange(RulePortRange { start: r.sport, end: r.sport }),
    ];
    m
}

/// xlb's reply rules now in the kernel (priority [`REPLY_RULE_PRIORITY`], table
/// [`REPLY_TABLE`]), both families.
///
/// # Errors
/// [`NicError::Netlink`] if the `RTM_GETRULE` dump fails.
pub fn reply_rules() -> Result<BTreeSet<ReplyRule>, NicError> {
    let mut out = BTreeSet::new();
    for r in dump_rules()? {
        let (mut src, mut prio, mut table, mut proto, mut sport) = (None, None, None, None, None);
        for a in &r.attributes {
            match a {
                RuleAttribute::Source(s) => src = Some(*s),
                RuleAttribute::Priority(p) => prio = Some(*p),
                RuleAttribute::Table(t) => table = Some(*t),
                RuleAttribute::IpProtocol(p) => proto = Some(u8::from(*p)),
                RuleAttribute::SourcePortRange(p) if p.start == p.end => sport = Some(p.start),
                _ => {}
            }
        }
        if prio == Some(REPLY_RULE_PRIORITY)
            && table == Some(REPLY_TABLE)
            && let (Some(src), Some(proto), Some(sport)) = (src, proto, sport)
        {
            out.insert(ReplyRule { src, proto, sport });
        }
    }
    Ok(out)
}

/// Every policy rule in the kernel, IPv4 then IPv6 (`RTM_GETRULE` dumps).
fn dump_rules() -> Result<Vec<RuleMessage>, NicError> {
    const OP: &str = "RTM_GETRULE dump";
    let mut out = Vec::new();
    for fam in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut msg = RuleMessage::default();
        msg.header.family = fam;
        let mut sock = RouteSocket::new(OP)?;
        for m in sock.request(OP, RouteNetlinkMessage::GetRule(msg), NLM_F_DUMP)? {
            if let RouteNetlinkMessage::NewRule(r) = m {
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// Makes xlb's reply rules exactly `want`: adds the missing ones, deletes the others. Returns
/// (added, deleted).
///
/// # Errors
/// [`NicError::Netlink`] naming the request that failed (`RTM_NEWRULE`, `RTM_DELRULE`); the
/// rules changed before it stay changed, and the next call finishes the job.
pub fn sync_reply_rules(want: &BTreeSet<ReplyRule>) -> Result<(usize, usize), NicError> {
    let have = reply_rules()?;
    let mut sock = RouteSocket::new("RTM_NEWRULE")?;
    let mut deleted = 0;
    for r in have.difference(want) {
        sock.request("RTM_DELRULE", RouteNetlinkMessage::DelRule(message(r)), 0)?;
        deleted += 1;
    }
    let mut added = 0;
    for r in want.difference(&have) {
        sock.request("RTM_NEWRULE", RouteNetlinkMessage::NewRule(message(r)), NLM_F_CREATE | NLM_F_EXCL)?;
        added += 1;
    }
    Ok((added, deleted))
}

/// Puts default routes (IPv4 and IPv6) into [`REPLY_TABLE`] through interface `ifindex` (the
/// punt device), replacing what is there. They go away with the device.
///
/// # Errors
/// [`NicError::Netlink`] if the kernel refuses a route.
pub fn route_reply_table_to(ifindex: u32) -> Result<(), NicError> {
    const OP: &str = "RTM_NEWROUTE";
    let mut sock = RouteSocket::new(OP)?;
    for fam in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut m = RouteMessage::default();
        m.header = RouteHeader {
            address_family: fam,
            table: RouteHeader::RT_TABLE_UNSPEC,
            protocol: RouteProtocol::Static,
            scope: RouteScope::Link,
            kind: RouteType::Unicast,
            ..RouteHeader::default()
        };
        m.attributes = vec![RouteAttribute::Table(REPLY_TABLE), RouteAttribute::Oif(ifindex)];
        sock.request(OP, RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_REPLACE)?;
    }
    Ok(())
}
