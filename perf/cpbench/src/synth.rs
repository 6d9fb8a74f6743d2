//! Synthetic clusters built in memory as k8s-openapi objects, as the API server would hand
//! them to a proxy: ClusterIP Services with one TCP port and EndpointSlices of at most 100
//! endpoints (the EndpointSlice controller's default `--max-endpoints-per-slice`).
//!
//! Addresses look like a kubeadm cluster's: cluster IPs from `10.96.0.0/12`, pod addresses
//! from `10.244.0.0/14`, nodes `node-N` spread over three zones.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use xlb::cluster::{ClusterState, LABEL_SERVICE_NAME};

/// Endpoints per EndpointSlice (the EndpointSlice controller's default maximum).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// Number of namespaces the Services are spread over.
pub const NAMESPACES: usize = 50;
/// Number of nodes the endpoints are spread over.
pub const NODES: usize = 100;
/// Service port of every synthetic Service.
pub const SERVICE_PORT: u16 = 80;
/// Endpoint (target) port of every synthetic Service.
pub const TARGET_PORT: u16 = 8080;

/// Size of a synthetic cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Name for reports, e.g. `A`.
    pub name: &'static str,
    /// Number of ClusterIP Services (one TCP port each).
    pub services: usize,
    /// Ready endpoints per Service.
    pub endpoints: usize,
}

/// Profile A: 10,000 Services × 10 endpoints.
pub const PROFILE_A: Profile = Profile { name: "A", services: 10_000, endpoints: 10 };
/// Profile B: 1,000 Services × 100 endpoints.
pub const PROFILE_B: Profile = Profile { name: "B", services: 1_000, endpoints: 100 };
/// The scaled-down profile of `--quick`: 200 Services × 10 endpoints.
pub const PROFILE_QUICK: Profile = Profile { name: "quick", services: 200, endpoints: 10 };

/// Cluster IP of Service `i`: `10.96.0.0/12` + i + 10 (the first addresses are taken by the
/// `kubernetes` and DNS Services in a real cluster).
pub fn cluster_ip(i: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 96, 0, 0));
    Ipv4Addr::from(base + u32::try_from(i + 10).unwrap_or(u32::MAX) % (1 << 20))
}

/// Pod address number `n` (global endpoint counter) in `10.244.0.0/14`.
pub fn pod_ip(n: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 244, 0, 0));
    Ipv4Addr::from(base + 1 + u32::try_from(n).unwrap_or(u32::MAX) % ((1 << 18) - 2))
}

/// Namespace and name of Service `i`.
pub fn service_ref(i: usize) -> (String, String) {
    (format!("ns-{}", i % NAMESPACES), format!("svc-{i}"))
}

/// The Service object number `i`.
pub fn service(i: usize) -> Service {
    let (ns, name) = service_ref(i);
    let ip = cluster_ip(i).to_string();
    Service {
        metadata: ObjectMeta {
            namespace: Some(ns),
            name: Some(name.clone()),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip.clone()),
            cluster_ips: Some(vec![ip]),
            ip_families: Some(vec!["IPv4".into()]),
            selector: Some(BTreeMap::from([("app".to_owned(), name)])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: i32::from(SERVICE_PORT),
                target_port: Some(IntOrString::Int(i32::from(TARGET_PORT))),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// One ready endpoint at `addr` on node `node`.
pub fn endpoint(addr: Ipv4Addr, node: usize) -> Endpoint {
    Endpoint {
        addresses: vec![addr.to_string()],
        conditions: Some(EndpointConditions { ready: Some(true), serving: Some(true), terminating: Some(false) }),
        node_name: Some(format!("node-{}", node % NODES)),
        zone: Some(format!("zone-{}", node % 3)),
        ..Default::default()
    }
}

/// The EndpointSlices of Service `i` with `n` endpoints whose addresses start at global
/// endpoint number `first`.
pub fn slices(i: usize, n: usize, first: usize) -> Vec<EndpointSlice> {
    let (ns, name) = service_ref(i);
    let mut out = Vec::with_capacity(n.div_ceil(MAX_ENDPOINTS_PER_SLICE));
    for (k, chunk_start) in (0..n).step_by(MAX_ENDPOINTS_PER_SLICE).enumerate() {
        let chunk_end = (chunk_start + MAX_ENDPOINTS_PER_SLICE).min(n);
        out.push(EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.clone()),
                name: Some(format!("{name}-{k:05}")),
                labels: Some(BTreeMap::from([(LABEL_SERVICE_NAME.to_owned(), name.clone())])),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: (chunk_start..chunk_end).map(|j| endpoint(pod_ip(first + j), first + j)).collect(),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: Some(i32::from(TARGET_PORT)),
                app_protocol: None,
            }]),
        });
    }
    out
}

/// The whole synthetic cluster of `p`.
pub fn cluster(p: Profile) -> ClusterState {
    let mut state = ClusterState {
        services: Vec::with_capacity(p.services),
        endpoint_slices: Vec::with_capacity(p.services * p.endpoints.div_ceil(MAX_ENDPOINTS_PER_SLICE)),
        node: None,
        local_addresses: Vec::new(),
    };
    for i in 0..p.services {
        state.services.push(Arc::new(service(i)));
        state.endpoint_slices.extend(slices(i, p.endpoints, i * p.endpoints).into_iter().map(Arc::new));
    }
    state
}

/// LoadBalancer ingress IP of Service `i` in [`as_local_load_balancers`]: `100.64.0.0/10` + i
/// (RFC 6598 shared address space, which no synthetic cluster address uses).
pub fn ingress_ip(i: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(100, 64, 0, 0));
    Ipv4Addr::from(base + u32::try_from(i).unwrap_or(u32::MAX) % (1 << 22))
}

/// `state` with every Service `i` made a LoadBalancer of `externalTrafficPolicy: Local`
/// whose `status.loadBalancer.ingress` is [`ingress_ip`]`(i)` (its index in
/// `state.services`), for what only such Services cost (the L2 owner's candidates). The
/// EndpointSlices are shared with `state`.
pub fn as_local_load_balancers(state: &ClusterState) -> ClusterState {
    let services = state
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = Service::clone(s);
            if let Some(spec) = s.spec.as_mut() {
                spec.type_ = Some("LoadBalancer".into());
                spec.external_traffic_policy = Some("Local".into());
            }
            s.status = Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ingress_ip(i).to_string()),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            });
            Arc::new(s)
        })
        .collect();
    ClusterState {
        services,
        endpoint_slices: state.endpoint_slices.clone(),
        node: state.node.clone(),
        local_addresses: state.local_addresses.clone(),
    }
}

/// A small deterministic PRNG (xorshift64*, Vigna 2016) so runs are repeatable without a
/// `rand` dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator (a zero seed is replaced, xorshift needs a non-zero state).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 { 0x9e37_79b9_7f4a_7c15 } else { seed })
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform-ish index below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % u64::try_from(n.max(1)).unwrap_or(u64::MAX)).unwrap_or(0)
    }
}

/// One EndpointSlice change: endpoint `endpoint` of Service `service` gets a new address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointChange {
    /// Service index.
    pub service: usize,
    /// `namespace/name` of the Service.
    pub service_name: String,
    /// Index of the slice in `ClusterState::endpoint_slices`.
    pub slice_index: usize,
    /// Endpoint index within the slice.
    pub endpoint: usize,
    /// The address it had (`None` if the indices pointed nowhere).
    pub old_addr: Option<String>,
    /// The new address.
    pub new_addr: Ipv4Addr,
}

/// Replaces the address of one random endpoint of one random Service in `state` (a Pod was
/// replaced by a new one, the most common EndpointSlice update), using fresh addresses from
/// `10.248.0.0/14` numbered by `serial`, and gives the slice a new `resourceVersion` as the
/// API server does on every write. Slices are assumed in the order [`cluster`] builds them.
pub fn change_one_endpoint(state: &mut ClusterState, p: Profile, rng: &mut Rng, serial: usize) -> EndpointChange {
    let per_service = p.endpoints.div_ceil(MAX_ENDPOINTS_PER_SLICE).max(1);
    let service = rng.below(p.services);
    let ep = rng.below(p.endpoints.max(1));
    let slice_index = service * per_service + ep / MAX_ENDPOINTS_PER_SLICE;
    let endpoint = ep % MAX_ENDPOINTS_PER_SLICE;
    let base = u32::from(Ipv4Addr::new(10, 248, 0, 0));
    let new_addr = Ipv4Addr::from(base + 1 + u32::try_from(serial).unwrap_or(0) % ((1 << 18) - 2));
    let mut old_addr = None;
    if let Some(slot) = state.endpoint_slices.get_mut(slice_index) {
        // A new object, as a watch event brings (the old one may still be shared).
        let slice = Arc::make_mut(slot);
        slice.metadata.resource_version = Some(format!("{}", 2 + serial));
        if let Some(e) = slice.endpoints.get_mut(endpoint) {
            old_addr = e.addresses.first().cloned();
            e.addresses = vec![new_addr.to_string()];
        }
    }
    let (ns, name) = service_ref(service);
    EndpointChange { service, service_name: format!("{ns}/{name}"), slice_index, endpoint, old_addr, new_addr }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_has_the_profile_shape() {
        let p = Profile { name: "t", services: 3, endpoints: 250 };
        let c = cluster(p);
        assert_eq!(c.services.len(), 3);
        assert_eq!(c.endpoint_slices.len(), 9, "250 endpoints = 3 slices of at most 100");
        assert_eq!(c.endpoint_slices[2].endpoints.len(), 50);
        let addrs: std::collections::BTreeSet<&str> =
            c.endpoint_slices.iter().flat_map(|s| &s.endpoints).map(|e| e.addresses[0].as_str()).collect();
        assert_eq!(addrs.len(), 750, "every endpoint address is distinct");
        assert_eq!(cluster_ip(0).to_string(), "10.96.0.10");
        assert_eq!(pod_ip(0).to_string(), "10.244.0.1");
        assert_eq!(pod_ip(99_999).to_string(), "10.245.134.160");
    }

    #[test]
    fn a_change_replaces_exactly_one_address() {
        let p = Profile { name: "t", services: 5, endpoints: 10 };
        let mut c = cluster(p);
        let before = c.clone();
        let ch = change_one_endpoint(&mut c, p, &mut Rng::new(7), 1);
        let diffs: Vec<usize> =
            (0..c.endpoint_slices.len()).filter(|&i| c.endpoint_slices[i] != before.endpoint_slices[i]).collect();
        assert_eq!(diffs, vec![ch.slice_index]);
        assert_eq!(c.endpoint_slices[ch.slice_index].endpoints[ch.endpoint].addresses[0], ch.new_addr.to_string());
        assert!(ch.service_name.ends_with(&format!("/svc-{}", ch.service)));
        let old = &before.endpoint_slices[ch.slice_index].endpoints[ch.endpoint].addresses[0];
        assert_eq!(ch.old_addr.as_ref(), Some(old));
    }
}
