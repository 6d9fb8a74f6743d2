//! Compact builders of k8s-openapi objects for the translation tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeStatus, Service, ServicePort,
    ServiceSpec as K8sServiceSpec, ServiceStatus, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::cluster::{ClusterState, LABEL_SERVICE_NAME};
use crate::config::Config;
use crate::translate::LABEL_ZONE;

/// Our node's name in tests.
pub(crate) const NODE: &str = "node-a";

fn meta(ns_name: &str) -> ObjectMeta {
    let (ns, name) = ns_name.split_once('/').unwrap_or(("default", ns_name));
    ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() }
}

/// A Service builder: `svc("default/web", "10.96.0.10").port("http", 80, 8080)`.
#[derive(Debug, Clone)]
pub(crate) struct Svc(pub Service);

pub(crate) fn svc(ns_name: &str, cluster_ip: &str) -> Svc {
    Svc(Service {
        metadata: meta(ns_name),
        spec: Some(K8sServiceSpec {
            cluster_ip: Some(cluster_ip.into()),
            cluster_ips: Some(vec![cluster_ip.into()]),
            ..Default::default()
        }),
        status: None,
    })
}

impl Svc {
    fn spec(&mut self) -> &mut K8sServiceSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }
    /// Adds a TCP port with a numeric targetPort.
    pub(crate) fn port(self, name: &str, port: i32, target: i32) -> Self {
        self.port_full(name, port, "TCP", Some(IntOrString::Int(target)))
    }
    /// Adds a port with any protocol and targetPort.
    pub(crate) fn port_full(mut self, name: &str, port: i32, proto: &str, target: Option<IntOrString>) -> Self {
        self.spec().ports.get_or_insert_with(Vec::new).push(ServicePort {
            name: (!name.is_empty()).then(|| name.to_owned()),
            port,
            protocol: Some(proto.into()),
            target_port: target,
            ..Default::default()
        });
        self
    }
    /// Sets `nodePort` of the last port.
    pub(crate) fn node_port(mut self, np: i32) -> Self {
        self.spec().ports.as_mut().and_then(|p| p.last_mut()).expect("a port").node_port = Some(np);
        self
    }
    pub(crate) fn ty(mut self, t: &str) -> Self {
        self.spec().type_ = Some(t.into());
        self
    }
    pub(crate) fn cluster_ips(mut self, ips: &[&str]) -> Self {
        let s = self.spec();
        s.cluster_ip = ips.first().map(|s| (*s).to_owned());
        s.cluster_ips = Some(ips.iter().map(|s| (*s).to_owned()).collect());
        s.ip_families =
            Some(ips.iter().map(|s| if s.contains(':') { "IPv6".to_owned() } else { "IPv4".to_owned() }).collect());
        self
    }
    pub(crate) fn etp_local(mut self) -> Self {
        self.spec().external_traffic_policy = Some("Local".into());
        self
    }
    pub(crate) fn itp_local(mut self) -> Self {
        self.spec().internal_traffic_policy = Some("Local".into());
        self
    }
    pub(crate) fn external_ips(mut self, ips: &[&str]) -> Self {
        self.spec().external_ips = Some(ips.iter().map(|s| (*s).to_owned()).collect());
        self
    }
    pub(crate) fn lb_ingress(mut self, ips: &[&str]) -> Self {
        self.0.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(
                    ips.iter()
                        .map(|ip| {
                            if ip.parse::<std::net::IpAddr>().is_ok() {
                                LoadBalancerIngress { ip: Some((*ip).into()), ..Default::default() }
                            } else {
                                LoadBalancerIngress { hostname: Some((*ip).into()), ..Default::default() }
                            }
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        self
    }
    pub(crate) fn lb_class(mut self, c: &str) -> Self {
        self.spec().load_balancer_class = Some(c.into());
        self
    }
    pub(crate) fn source_ranges(mut self, r: &[&str]) -> Self {
        self.spec().load_balancer_source_ranges = Some(r.iter().map(|s| (*s).to_owned()).collect());
        self
    }
    pub(crate) fn allocate_lb_node_ports(mut self, v: bool) -> Self {
        self.spec().allocate_load_balancer_node_ports = Some(v);
        self
    }
    pub(crate) fn affinity(mut self, timeout: Option<i32>) -> Self {
        let s = self.spec();
        s.session_affinity = Some("ClientIP".into());
        s.session_affinity_config =
            timeout.map(|t| SessionAffinityConfig { client_ip: Some(ClientIPConfig { timeout_seconds: Some(t) }) });
        self
    }
    pub(crate) fn publish_not_ready(mut self) -> Self {
        self.spec().publish_not_ready_addresses = Some(true);
        self
    }
    pub(crate) fn traffic_distribution(mut self, v: &str) -> Self {
        self.spec().traffic_distribution = Some(v.into());
        self
    }
    pub(crate) fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }
    pub(crate) fn label(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.labels.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }
    pub(crate) fn with(mut self, f: impl FnOnce(&mut K8sServiceSpec)) -> Self {
        f(self.spec());
        self
    }
}

/// An endpoint builder: `ep("10.0.0.1").on("node-a").zone("z1")`.
#[derive(Debug, Clone)]
pub(crate) struct Ep(pub Endpoint);

pub(crate) fn ep(addr: &str) -> Ep {
    Ep(Endpoint {
        addresses: vec![addr.into()],
        conditions: Some(EndpointConditions { ready: Some(true), serving: Some(true), terminating: Some(false) }),
        ..Default::default()
    })
}

impl Ep {
    fn cond(&mut self) -> &mut EndpointConditions {
        self.0.conditions.get_or_insert_with(Default::default)
    }
    /// Not ready, not serving, not terminating (failing readiness).
    pub(crate) fn not_ready(mut self) -> Self {
        *self.cond() = EndpointConditions { ready: Some(false), serving: Some(false), terminating: Some(false) };
        self
    }
    /// Terminating; `serving` says whether it still passes readiness (EPS-06).
    pub(crate) fn terminating(mut self, serving: bool) -> Self {
        *self.cond() = EndpointConditions { ready: Some(false), serving: Some(serving), terminating: Some(true) };
        self
    }
    /// No conditions at all (all nil).
    pub(crate) fn no_conditions(mut self) -> Self {
        self.0.conditions = Some(EndpointConditions::default());
        self
    }
    pub(crate) fn on(mut self, node: &str) -> Self {
        self.0.node_name = Some(node.into());
        self
    }
    pub(crate) fn zone(mut self, z: &str) -> Self {
        self.0.zone = Some(z.into());
        self
    }
    pub(crate) fn hint_zones(mut self, zones: &[&str]) -> Self {
        let h = self.0.hints.get_or_insert_with(EndpointHints::default);
        h.for_zones = Some(zones.iter().map(|z| ForZone { name: (*z).into() }).collect());
        self
    }
    pub(crate) fn hint_nodes(mut self, nodes: &[&str]) -> Self {
        let h = self.0.hints.get_or_insert_with(EndpointHints::default);
        h.for_nodes = Some(nodes.iter().map(|n| ForNode { name: (*n).into() }).collect());
        self
    }
    pub(crate) fn addresses(mut self, a: &[&str]) -> Self {
        self.0.addresses = a.iter().map(|s| (*s).to_owned()).collect();
        self
    }
}

/// An EndpointSlice builder: `slice("default/web-1", "web", "IPv4").port("http", 8080).ep(...)`.
#[derive(Debug, Clone)]
pub(crate) struct Slice(pub EndpointSlice);

pub(crate) fn slice(ns_name: &str, service: &str, address_type: &str) -> Slice {
    let mut m = meta(ns_name);
    m.labels = Some(BTreeMap::from([(LABEL_SERVICE_NAME.to_owned(), service.to_owned())]));
    Slice(EndpointSlice { address_type: address_type.into(), endpoints: Vec::new(), metadata: m, ports: None })
}

impl Slice {
    /// Adds a TCP port entry.
    pub(crate) fn port(self, name: &str, port: i32) -> Self {
        self.port_full(name, Some(port), "TCP")
    }
    pub(crate) fn port_full(mut self, name: &str, port: Option<i32>, proto: &str) -> Self {
        self.0.ports.get_or_insert_with(Vec::new).push(EndpointPort {
            name: Some(name.into()),
            port,
            protocol: Some(proto.into()),
            app_protocol: None,
        });
        self
    }
    pub(crate) fn ep(mut self, e: Ep) -> Self {
        self.0.endpoints.push(e.0);
        self
    }
    pub(crate) fn label(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.labels.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }
}

/// A Node builder.
#[derive(Debug, Clone)]
pub(crate) struct NodeB(pub Node);

pub(crate) fn node(name: &str) -> NodeB {
    NodeB(Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: None,
        status: Some(NodeStatus { addresses: Some(Vec::new()), ..Default::default() }),
    })
}

impl NodeB {
    pub(crate) fn addr(mut self, ty: &str, a: &str) -> Self {
        self.0
            .status
            .get_or_insert_with(Default::default)
            .addresses
            .get_or_insert_with(Vec::new)
            .push(NodeAddress { address: a.into(), type_: ty.into() });
        self
    }
    pub(crate) fn zone(mut self, z: &str) -> Self {
        self.0.metadata.labels.get_or_insert_with(BTreeMap::new).insert(LABEL_ZONE.into(), z.into());
        self
    }
    pub(crate) fn label(mut self, k: &str, v: &str) -> Self {
        self.0.metadata.labels.get_or_insert_with(BTreeMap::new).insert(k.into(), v.into());
        self
    }
}

/// A config for node [`NODE`].
pub(crate) fn cfg() -> Config {
    Config { node_name: Some(NODE.into()), ..Default::default() }
}

/// Our node with one InternalIP of each family and zone `z1`.
pub(crate) fn our_node() -> NodeB {
    node(NODE).addr("InternalIP", "192.168.1.10").addr("InternalIP", "fd00:1::10").addr("Hostname", NODE).zone("z1")
}

/// A cluster state from builders.
pub(crate) fn state(svcs: Vec<Svc>, slices: Vec<Slice>, n: Option<NodeB>) -> ClusterState {
    ClusterState {
        services: svcs.into_iter().map(|s| std::sync::Arc::new(s.0)).collect(),
        endpoint_slices: slices.into_iter().map(|s| std::sync::Arc::new(s.0)).collect(),
        node: n.map(|n| n.0),
        local_addresses: Vec::new(),
    }
}
