//! Single Service fields read as the API server would: ports and protocols, traffic
//! policies, addresses and CIDRs, each bad value reported naming its field.

use std::net::IpAddr;

use dataplane::addr::Cidr;
use dataplane::tables::{Conditions, L4Proto};
use k8s_openapi::api::discovery::v1::Endpoint;

use super::select::Policy;
use super::{Issue, Severity, TranslateReport};

/// A validated Service port.
pub(super) struct PortInfo {
    /// Port name, `""` when unnamed.
    pub(super) name: String,
    pub(super) proto: L4Proto,
    pub(super) port: u16,
    pub(super) node_port: Option<u16>,
    /// Numeric target port (PORT-05 fallback); `None` when `targetPort` is a name.
    pub(super) target_number: Option<u16>,
    /// Display name of the port in table names.
    pub(super) table_name: String,
}

/// An EndpointSlice endpoint's conditions as kube-proxy reads them (EPS-05..07, the API
/// docs): nil `ready` and `serving` are true, nil `terminating` is false, and
/// `publishNotReadyAddresses` (`publish_not_ready`) makes every endpoint ready.
pub(crate) fn conditions_of(e: &Endpoint, publish_not_ready: bool) -> Conditions {
    let c = e.conditions.as_ref();
    Conditions {
        ready: publish_not_ready || c.and_then(|c| c.ready).unwrap_or(true),
        serving: c.and_then(|c| c.serving).unwrap_or(true),
        terminating: c.and_then(|c| c.terminating).unwrap_or(false),
    }
}

/// An address from the Service spec or status, with the field it came from.
pub(super) struct SourcedAddr {
    pub(super) addr: IpAddr,
    pub(super) field: String,
}

/// Parses an address of a Kubernetes object as kube-proxy does (`ParseIPSloppy`, Go's
/// `net.ParseIP`): an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is the IPv4 address, so
/// it belongs to the IPv4 family and is the same frontend or backend as `10.0.0.1` (the
/// dataplane keys both alike, [`dataplane::addr::mapped`]).
pub(crate) fn parse_ip(s: &str) -> Option<IpAddr> {
    s.trim().parse::<IpAddr>().ok().map(|a| a.to_canonical())
}

/// Parses an address from field `field` of object `label` ([`parse_ip`]); a bad one is
/// reported as an error naming the field (only that address is skipped) and gives `None`.
pub(super) fn parse_sourced(
    s: &str,
    field: String,
    what: &str,
    label: &str,
    report: &mut TranslateReport,
) -> Option<SourcedAddr> {
    match parse_ip(s) {
        Some(addr) => Some(SourcedAddr { addr, field }),
        None => {
            report.issues.push(Issue {
                severity: Severity::Error,
                object: label.to_owned(),
                field,
                message: format!("{s:?} is not an IP address; this {what} is not programmed"),
            });
            None
        }
    }
}

pub(super) fn parse_proto(s: Option<&str>) -> Option<L4Proto> {
    match s.unwrap_or("TCP") {
        "TCP" => Some(L4Proto::Tcp),
        "UDP" => Some(L4Proto::Udp),
        "SCTP" => Some(L4Proto::Sctp),
        _ => None,
    }
}

pub(super) fn port_u16(v: i32) -> Option<u16> {
    u16::try_from(v).ok().filter(|&p| p != 0)
}

pub(super) fn parse_policy(v: Option<&str>) -> Option<Policy> {
    match v.unwrap_or("Cluster") {
        "Cluster" | "" => Some(Policy::Cluster),
        "Local" => Some(Policy::Local),
        _ => None,
    }
}

/// Parses a CIDR as the API server does: host bits are allowed and masked. A prefix of
/// IPv4-mapped addresses (`::ffff:10.0.0.0/104`) is the IPv4 prefix (`10.0.0.0/8`), as
/// [`parse_ip`] reads its addresses.
pub(super) fn parse_cidr_lenient(s: &str) -> Option<Cidr> {
    let s = s.trim();
    let (a, l) = s.split_once('/')?;
    let mut addr: IpAddr = a.parse().ok()?;
    let mut len: u8 = l.parse().ok()?;
    if let IpAddr::V6(v6) = addr
        && let Some(v4) = v6.to_ipv4_mapped()
        && (96..=128).contains(&len)
    {
        (addr, len) = (IpAddr::V4(v4), len - 96);
    }
    let masked = match addr {
        IpAddr::V4(v) => {
            if len > 32 {
                return None;
            }
            let m = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            IpAddr::from((u32::from(v) & m).to_be_bytes())
        }
        IpAddr::V6(v) => {
            if len > 128 {
                return None;
            }
            let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            IpAddr::from((u128::from(v) & m).to_be_bytes())
        }
    };
    Some(Cidr { addr: masked, len })
}
