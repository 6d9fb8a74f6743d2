//! This node as the translation sees it: its name, zone and addresses (config
//! `nodeAddresses`, the Node's `status.addresses`, the host's interfaces), and which of them
//! serve NodePorts (NPA-01..07).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

use super::{Issue, LABEL_ZONE, Severity, TranslateReport};
use crate::config::{Config, NodePortAddress};

/// Address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Family {
    V4,
    V6,
}

impl Family {
    pub(super) fn of(a: IpAddr) -> Self {
        if a.is_ipv4() { Self::V4 } else { Self::V6 }
    }
    /// The EndpointSlice `addressType` / Service `ipFamilies` spelling.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
    pub(super) fn lower(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }
}

/// Whether a node address came in as `InternalIP` (or from the config) or `ExternalIP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AddrType {
    Internal,
    External,
    /// An interface address that the Node object does not list.
    Local,
}

/// This node as the translation sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct NodeInfo {
    pub(super) name: Option<String>,
    pub(super) zone: Option<String>,
    /// In order: config `nodeAddresses`, then Node `status.addresses` (NPA-07).
    pub(super) addresses: Vec<(IpAddr, AddrType)>,
}

impl NodeInfo {
    pub(super) fn new(node: Option<&Node>, local: &[IpAddr], cfg: &Config, report: &mut TranslateReport) -> Self {
        let name = cfg.node_name().map(str::to_owned).or_else(|| node.and_then(|n| n.metadata.name.clone()));
        let zone = node
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(LABEL_ZONE))
            .filter(|z| !z.is_empty())
            .cloned();
        let mut addresses: Vec<(IpAddr, AddrType)> = Vec::new();
        let mut push = |a: IpAddr, t: AddrType| {
            // NPA-05: loopback NodePorts cannot be served from XDP; never use them.
            if a.is_loopback() || a.is_unspecified() || addresses.iter().any(|(x, _)| *x == a) {
                return;
            }
            addresses.push((a, t));
        };
        // An IPv4-mapped IPv6 address is its IPv4 address, as the objects' addresses are read
        // (`fields::parse_ip`).
        for a in &cfg.node_addresses {
            push(a.to_canonical(), AddrType::Internal);
        }
        if let Some(n) = node {
            let label = format!("Node {}", n.metadata.name.as_deref().unwrap_or_default());
            let list = n.status.as_ref().and_then(|s| s.addresses.as_ref());
            for (i, na) in list.into_iter().flatten().enumerate() {
                let t = match na.type_.as_str() {
                    "InternalIP" => AddrType::Internal,
                    "ExternalIP" => AddrType::External,
                    _ => continue, // Hostname, InternalDNS, ExternalDNS
                };
                match super::fields::parse_ip(&na.address) {
                    Some(a) => push(a, t),
                    None => report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label.clone(),
                        field: format!("status.addresses[{i}].address"),
                        message: format!("{:?} is not an IP address; ignored", na.address),
                    }),
                }
            }
        }
        for a in local {
            // IPv6 link-local addresses need a zone to mean anything; a NodePort there is not one.
            if matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()) {
                continue;
            }
            push(*a, AddrType::Local);
        }
        Self { name, zone, addresses }
    }

    /// The primary address of a family: the first InternalIP, else the first ExternalIP
    /// (kubelet `--node-ip` semantics, NPA-07).
    pub(super) fn primary(&self, fam: Family) -> Option<IpAddr> {
        let of = |t: AddrType| self.addresses.iter().find(|(a, at)| *at == t && Family::of(*a) == fam).map(|(a, _)| *a);
        of(AddrType::Internal).or_else(|| of(AddrType::External))
    }

    /// Node addresses that serve NodePorts (NPA-01..04).
    pub(super) fn node_port_addresses(&self, cfg: &Config) -> Vec<IpAddr> {
        if cfg.node_port_addresses.is_empty() {
            // NPA-02 (iptables default): every node address.
            return self.addresses.iter().map(|(a, _)| *a).collect();
        }
        let primary = cfg.node_port_addresses.contains(&NodePortAddress::Primary);
        let primaries = [self.primary(Family::V4), self.primary(Family::V6)];
        self.addresses
            .iter()
            .map(|(a, _)| *a)
            .filter(|a| {
                (primary && primaries.contains(&Some(*a)))
                    || cfg.node_port_addresses.iter().any(|s| match s {
                        NodePortAddress::Cidr(c) => c.contains(*a),
                        NodePortAddress::Primary => false,
                    })
            })
            .collect()
    }
}
