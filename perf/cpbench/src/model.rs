//! From xlb's [`TablesSpec`] back to kube-proxy's view: one [`ServicePort`] per Service port
//! and address family (kube-proxy's `ServicePortName` in one per-family proxier), with the
//! endpoints of its internal and external traffic classes.
//!
//! xlb's translation splits a Service port into `…` and `…/external` specs when the two traffic
//! classes select different endpoints; kube-proxy instead keeps one service port with a
//! `Cluster` policy chain and a `Local` policy chain (`CategorizeEndpoints` in
//! `pkg/proxy/topology.go`, used by both `pkg/proxy/nftables/proxier.go` and
//! `pkg/proxy/iptables/proxier.go`). This module rejoins the specs. The endpoints kube-proxy
//! programs are the eligible ones ([`BackendSpec::eligible`] and weight > 0); weights and the
//! xlb scheduler are ignored, as kube-proxy picks uniformly at random.

use std::collections::BTreeMap;
use std::net::IpAddr;

use dataplane::addr::Cidr;
use dataplane::tables::{BackendSpec, EmptyAction, FrontendKind, L4Proto, TablesSpec};

/// Why a [`TablesSpec`] cannot be turned into kube-proxy service ports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A service spec name is not of the form `namespace/name:port[/suffix…]` that
    /// `xlb::translate::build_spec` produces.
    #[error("service spec name {0:?} is not namespace/name:port[/suffix]")]
    BadName(String),
    /// A service spec has no frontend, so neither its protocol nor its family is known.
    #[error("service spec {0:?} has no frontend")]
    NoFrontend(String),
}

/// The name parts of one xlb service spec (`namespace/name:port[/ipv4|/ipv6][/external]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpecName {
    /// Namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// Port name (or number when the Service port is unnamed).
    pub port: String,
    /// The spec is the external traffic class of a split Service port.
    pub external: bool,
}

impl SpecName {
    /// Parses a name produced by `xlb::translate::build_spec`.
    ///
    /// # Errors
    /// [`ModelError::BadName`] if there is no `/` before a `:`.
    pub fn parse(s: &str) -> Result<Self, ModelError> {
        let bad = || ModelError::BadName(s.to_owned());
        let (svc, rest) = s.split_once(':').ok_or_else(bad)?;
        let (namespace, name) = svc.split_once('/').ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let port = parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?;
        let mut external = false;
        for p in parts {
            match p {
                "external" => external = true,
                "ipv4" | "ipv6" => {}
                _ => return Err(bad()),
            }
        }
        if namespace.is_empty() || name.is_empty() {
            return Err(bad());
        }
        Ok(Self { namespace: namespace.into(), name: name.into(), port: port.into(), external })
    }

    /// kube-proxy's `ServicePortName.String()`: `namespace/name:port`.
    pub fn service_port_name(&self) -> String {
        format!("{}/{}:{}", self.namespace, self.name, self.port)
    }

    /// `namespace/name`, the Service this port belongs to.
    pub fn service(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One traffic class (internal = ClusterIP, external = NodePort / externalIPs / LB) of a
/// service port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrafficClass {
    /// Endpoints that get new flows: (address, port), sorted.
    pub endpoints: Vec<(IpAddr, u16)>,
    /// What happens when `endpoints` is empty: `Reject` (no usable endpoint in the cluster)
    /// or `Drop` (a `Local` policy without a local endpoint).
    pub when_empty: Option<EmptyAction>,
    /// Whether new flows of this class are masqueraded ([`dataplane::tables::Frontend::masquerade`]).
    pub masquerade: bool,
}

/// One kube-proxy service port of one address family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Name parts (with `external` false).
    pub name: SpecName,
    /// Protocol.
    pub proto: L4Proto,
    /// IPv6 (the `ip6 kube-proxy` table / ip6tables) rather than IPv4.
    pub ipv6: bool,
    /// Cluster IP and service port, when programmed.
    pub cluster_ip: Option<(IpAddr, u16)>,
    /// `spec.externalIPs` frontends: (address, service port).
    pub external_ips: Vec<(IpAddr, u16)>,
    /// LoadBalancer ingress frontends: (address, service port).
    pub lb_ips: Vec<(IpAddr, u16)>,
    /// `loadBalancerSourceRanges` of the LoadBalancer frontends (empty = no firewall).
    pub source_ranges: Vec<Cidr>,
    /// The NodePort, if the Service port has one.
    pub node_port: Option<u16>,
    /// Node addresses the NodePort is served on.
    pub node_port_addrs: Vec<IpAddr>,
    /// ClusterIP traffic.
    pub internal: TrafficClass,
    /// External traffic (same endpoints as `internal` unless xlb split the spec).
    pub external: TrafficClass,
    /// The external class uses the `Local` policy (its frontends keep the client address).
    pub external_local: bool,
    /// The internal class uses the `Local` policy (only when the specs are split and the
    /// external side is the masqueraded `Cluster` one).
    pub internal_local: bool,
    /// ClientIP affinity timeout in seconds.
    pub affinity_timeout_s: Option<u32>,
}

impl ServicePort {
    /// Lower-case protocol as kube-proxy writes it in rules and chain names.
    pub fn protocol(&self) -> &'static str {
        match self.proto {
            L4Proto::Tcp => "tcp",
            L4Proto::Udp => "udp",
            L4Proto::Sctp => "sctp",
        }
    }

    /// Whether the port has any frontend other than the cluster IP
    /// (`ExternallyAccessible()` in `pkg/proxy/serviceport.go`).
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.lb_ips.is_empty()
    }

    /// `hasEndpoints` of kube-proxy's `CategorizeEndpoints`: the Service has a usable
    /// endpoint somewhere in the cluster. A `Drop` verdict means exactly that (xlb drops only
    /// when endpoints exist but none is local).
    pub fn has_endpoints(&self) -> bool {
        let usable = |c: &TrafficClass| !c.endpoints.is_empty() || c.when_empty == Some(EmptyAction::Drop);
        usable(&self.internal) || usable(&self.external)
    }

    /// Every endpoint some policy chain jumps to (`allLocallyReachableEndpoints`), sorted.
    pub fn all_endpoints(&self) -> Vec<(IpAddr, u16)> {
        let mut v: Vec<(IpAddr, u16)> =
            self.internal.endpoints.iter().chain(&self.external.endpoints).copied().collect();
        v.sort();
        v.dedup();
        v
    }

    /// The endpoints of the `Cluster` policy chain (`clusterEndpoints`); `None` when no
    /// traffic class uses the Cluster policy.
    pub fn cluster_endpoints(&self) -> Option<&[(IpAddr, u16)]> {
        if !self.internal_local {
            Some(&self.internal.endpoints)
        } else if !self.external_local {
            Some(&self.external.endpoints)
        } else {
            None
        }
    }

    /// The endpoints of the `Local` policy chain (`localEndpoints`); `None` when no traffic
    /// class uses the Local policy.
    pub fn local_endpoints(&self) -> Option<&[(IpAddr, u16)]> {
        if self.internal_local {
            Some(&self.internal.endpoints)
        } else if self.external_local {
            Some(&self.external.endpoints)
        } else {
            None
        }
    }
}

fn eligible(b: &[BackendSpec]) -> Vec<(IpAddr, u16)> {
    let mut v: Vec<(IpAddr, u16)> = b.iter().filter(|b| b.eligible && b.weight > 0).map(|b| (b.addr, b.port)).collect();
    v.sort();
    v.dedup();
    v
}

/// Groups the specs of `spec` into kube-proxy service ports, sorted by (family, namespace,
/// name, port). Only the specs whose Service is `only` (`namespace/name`) when given.
///
/// # Errors
/// [`ModelError`] for a spec name or frontend list `build_spec` never produces.
pub fn service_ports(spec: &TablesSpec, only: Option<&str>) -> Result<Vec<ServicePort>, ModelError> {
    let mut out: BTreeMap<(bool, String, String, String), ServicePort> = BTreeMap::new();
    for s in &spec.services {
        let n = SpecName::parse(&s.name)?;
        if only.is_some_and(|o| o != n.service()) {
            continue;
        }
        let first = s.frontends.first().ok_or_else(|| ModelError::NoFrontend(s.name.clone()))?;
        let ipv6 = first.addr.is_ipv6();
        let key = (ipv6, n.namespace.clone(), n.name.clone(), n.port.clone());
        let sp = out.entry(key).or_insert_with(|| ServicePort {
            name: SpecName { external: false, ..n.clone() },
            proto: first.proto,
            ipv6,
            cluster_ip: None,
            external_ips: Vec::new(),
            lb_ips: Vec::new(),
            source_ranges: Vec::new(),
            node_port: None,
            node_port_addrs: Vec::new(),
            internal: TrafficClass::default(),
            external: TrafficClass::default(),
            external_local: false,
            internal_local: false,
            affinity_timeout_s: s.affinity_timeout_s,
        });
        let class =
            TrafficClass { endpoints: eligible(&s.backends), when_empty: Some(s.when_empty), masquerade: false };
        let mut has_internal = false;
        let mut has_external = false;
        let mut ext_masq = false;
        for f in &s.frontends {
            match f.kind {
                FrontendKind::ClusterIp => {
                    sp.cluster_ip = Some((f.addr, f.port));
                    sp.internal.masquerade = f.masquerade;
                    has_internal = true;
                }
                FrontendKind::NodePort => {
                    sp.node_port = Some(f.port);
                    sp.node_port_addrs.push(f.addr);
                    has_external = true;
                    ext_masq |= f.masquerade;
                }
                FrontendKind::ExternalIp => {
                    sp.external_ips.push((f.addr, f.port));
                    has_external = true;
                    ext_masq |= f.masquerade;
                }
                FrontendKind::LoadBalancer => {
                    sp.lb_ips.push((f.addr, f.port));
                    for r in &f.source_ranges {
                        if !sp.source_ranges.contains(r) {
                            sp.source_ranges.push(*r);
                        }
                    }
                    has_external = true;
                    ext_masq |= f.masquerade;
                }
            }
        }
        if has_internal {
            let m = sp.internal.masquerade;
            sp.internal = TrafficClass { masquerade: m, ..class.clone() };
        }
        if has_external {
            sp.external = TrafficClass { masquerade: ext_masq, ..class.clone() };
        }
        if n.external {
            // Split specs: one side uses the Local policy. The external side keeps the client
            // address under `externalTrafficPolicy: Local`; if it masquerades while the
            // ClusterIP side does not, the internal side is the Local one. With
            // masqueradeAll both masquerade and eTP Local is assumed.
            if !ext_masq || sp.internal.masquerade {
                sp.external_local = true;
            } else {
                sp.internal_local = true;
            }
        } else if has_external {
            sp.external_local = !ext_masq;
        }
    }
    let mut v: Vec<ServicePort> = out.into_values().collect();
    for sp in &mut v {
        sp.node_port_addrs.sort();
        sp.node_port_addrs.dedup();
        sp.external_ips.sort();
        sp.lb_ips.sort();
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_names_parse() {
        let n = SpecName::parse("demo/web:http/ipv6/external").unwrap();
        assert_eq!((n.namespace.as_str(), n.name.as_str(), n.port.as_str(), n.external), ("demo", "web", "http", true));
        assert_eq!(n.service_port_name(), "demo/web:http");
        assert!(SpecName::parse("web:http").is_err());
        assert!(SpecName::parse("demo/web:http/bogus").is_err());
        assert!(SpecName::parse("demo/web:").is_err());
    }
}
