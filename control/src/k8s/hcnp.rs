//! The `healthCheckNodePort` list for [`crate::http::HealthCheckServers`] (TP-09).

use std::collections::{BTreeMap, BTreeSet};

use crate::cluster::{ClusterIndex, ClusterState, ServiceRef};
use crate::http::HealthCheckService;
use crate::translate::proxied;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The Services that need a health check server on this node, with the number of this node's
/// ready endpoints for each.
///
/// Like kube-proxy (`apiservice.NeedsHealthCheck` and `EndpointsMap.LocalReadyEndpoints`,
/// `pkg/proxy/endpointschangetracker.go`): a Service needs one when it is of type
/// `LoadBalancer`, has `externalTrafficPolicy: Local` and a `healthCheckNodePort`, and is one
/// xlb proxies (Services and EndpointSlices labelled for another proxy or headless are left
/// out, as by the translation and kube-proxy's informers). Its count
/// is the number of distinct `address:port` pairs over its EndpointSlices' ports of the
/// endpoints whose `nodeName` is `node_name` and that are ready (`conditions.ready` true or
/// unset, or any endpoint when the Service has `publishNotReadyAddresses`, EPS-05). Only
/// `addresses[0]` counts (EPS-11). Sorted by port.
pub fn health_check_services(state: &ClusterState, node_name: &str) -> Vec<HealthCheckService> {
    let mut by_service: BTreeMap<ServiceRef, Vec<&EndpointSlice>> = BTreeMap::new();
    for sl in &state.endpoint_slices {
        if let Some(r) = ServiceRef::of_slice(sl) {
            by_service.entry(r).or_default().push(sl);
        }
    }
    health_checks(state.services.iter().map(|s| &**s), |r| by_service.get(r).cloned().unwrap_or_default(), node_name)
}

/// [`health_check_services`] of an indexed cluster: reads only the slices of the Services that
/// need a health check server.
pub fn health_check_services_indexed(cluster: &ClusterIndex, node_name: &str) -> Vec<HealthCheckService> {
    health_checks(cluster.services().map(|(_, s)| &**s), |r| cluster.slices_of(r).map(|s| &**s).collect(), node_name)
}

fn health_checks<'a>(
    services: impl Iterator<Item = &'a Service>,
    slices_of: impl Fn(&ServiceRef) -> Vec<&'a EndpointSlice>,
    node_name: &str,
) -> Vec<HealthCheckService> {
    let mut wanted: BTreeMap<ServiceRef, (u16, bool)> = BTreeMap::new();
    for s in services {
        if !proxied(&s.metadata) {
            continue;
        }
        let Some(spec) = &s.spec else { continue };
        if spec.type_.as_deref() != Some("LoadBalancer") || spec.external_traffic_policy.as_deref() != Some("Local") {
            continue;
        }
        let Some(port) = spec.health_check_node_port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0) else {
            continue;
        };
        wanted.insert(ServiceRef::of_service(s), (port, spec.publish_not_ready_addresses == Some(true)));
    }
    let mut local: BTreeMap<&ServiceRef, BTreeSet<(String, i32)>> = BTreeMap::new();
    for (key, (_, publish_not_ready)) in &wanted {
        for sl in slices_of(key).into_iter().filter(|sl| proxied(&sl.metadata)) {
            let ports: Vec<i32> = sl.ports.iter().flatten().filter_map(|p| p.port).collect();
            for ep in &sl.endpoints {
                if ep.node_name.as_deref() != Some(node_name) {
                    continue;
                }
                if !crate::translate::conditions_of(ep, *publish_not_ready).ready {
                    continue;
                }
                let Some(addr) = ep.addresses.first() else { continue };
                for p in &ports {
                    local.entry(key).or_default().insert((addr.clone(), *p));
                }
            }
        }
    }
    let mut out: Vec<HealthCheckService> = wanted
        .iter()
        .map(|(r, (port, _))| HealthCheckService {
            port: *port,
            service: r.clone(),
            local_endpoints: local.get(r).map_or(0, BTreeSet::len),
        })
        .collect();
    out.sort_by(|a, b| (a.port, &a.service).cmp(&(b.port, &b.service)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Service, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn svc(name: &str, ty: &str, etp: &str, hc: Option<i32>) -> std::sync::Arc<Service> {
        std::sync::Arc::new(Service {
            metadata: ObjectMeta { namespace: Some("default".into()), name: Some(name.into()), ..Default::default() },
            spec: Some(ServiceSpec {
                type_: Some(ty.into()),
                external_traffic_policy: Some(etp.into()),
                health_check_node_port: hc,
                ..Default::default()
            }),
            status: None,
        })
    }

    fn ep(addr: &str, node: &str, ready: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec![addr.into()],
            node_name: Some(node.into()),
            conditions: Some(EndpointConditions { ready, ..Default::default() }),
            ..Default::default()
        }
    }

    fn slice(name: &str, svc: &str, ports: &[i32], endpoints: Vec<Endpoint>) -> std::sync::Arc<EndpointSlice> {
        std::sync::Arc::new(EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                labels: Some([(crate::cluster::LABEL_SERVICE_NAME.to_owned(), svc.to_owned())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(ports.iter().map(|p| EndpointPort { port: Some(*p), ..Default::default() }).collect()),
        })
    }

    #[test]
    fn tp_09_counts_local_ready_endpoints_of_etp_local_load_balancers() {
        let state = ClusterState {
            services: vec![
                svc("lb", "LoadBalancer", "Local", Some(32000)),
                svc("cluster", "LoadBalancer", "Cluster", Some(32001)),
                svc("np", "NodePort", "Local", Some(32002)),
                svc("empty", "LoadBalancer", "Local", Some(32003)),
            ],
            endpoint_slices: vec![
                slice(
                    "lb-1",
                    "lb",
                    &[80, 443],
                    vec![
                        ep("10.0.0.1", "node-a", Some(true)),
                        ep("10.0.0.2", "node-a", None),
                        ep("10.0.0.3", "node-a", Some(false)),
                        ep("10.0.0.4", "node-b", Some(true)),
                    ],
                ),
                // A duplicate of 10.0.0.1 in a second slice counts once.
                slice("lb-2", "lb", &[80], vec![ep("10.0.0.1", "node-a", Some(true))]),
                slice("empty-1", "empty", &[80], vec![ep("10.0.0.9", "node-b", Some(true))]),
            ],
            node: None,
            local_addresses: Vec::new(),
        };
        let hc = health_check_services(&state, "node-a");
        assert_eq!(hc.len(), 2);
        assert_eq!((hc[0].port, hc[0].service.name.as_str(), hc[0].local_endpoints), (32000, "lb", 4));
        assert_eq!((hc[1].port, hc[1].service.name.as_str(), hc[1].local_endpoints), (32003, "empty", 0));
    }

    #[test]
    fn services_handed_to_another_proxy_get_no_health_check_server() {
        // kube-proxy never sees a Service labelled service.kubernetes.io/service-proxy-name
        // (its informer's label selector), so it serves no healthCheckNodePort for it; the
        // proxy named owns that port (TP-09).
        let mut s = (*svc("lb", "LoadBalancer", "Local", Some(32000))).clone();
        s.metadata.labels =
            Some([(crate::translate::LABEL_SERVICE_PROXY_NAME.to_owned(), "other-proxy".to_owned())].into());
        let state = ClusterState {
            services: vec![std::sync::Arc::new(s)],
            endpoint_slices: vec![slice("lb-1", "lb", &[80], vec![ep("10.0.0.1", "node-a", Some(true))])],
            node: None,
            local_addresses: Vec::new(),
        };
        assert!(health_check_services(&state, "node-a").is_empty());
    }

    #[test]
    fn headless_labelled_services_get_no_health_check_server_and_labelled_slices_count_no_endpoint() {
        // The same label selector: service.kubernetes.io/headless on a Service, and either
        // label on an EndpointSlice, hides the object from kube-proxy.
        let labelled = |o: &mut ObjectMeta, k: &str| {
            o.labels.get_or_insert_default().insert(k.to_owned(), String::new());
        };
        let mut headless = (*svc("hl", "LoadBalancer", "Local", Some(32001))).clone();
        labelled(&mut headless.metadata, crate::translate::LABEL_HEADLESS);
        let mut other = (*slice("lb-x", "lb", &[80], vec![ep("10.0.0.2", "node-a", Some(true))])).clone();
        labelled(&mut other.metadata, crate::translate::LABEL_SERVICE_PROXY_NAME);
        let mut hidden = (*slice("lb-h", "lb", &[80], vec![ep("10.0.0.3", "node-a", Some(true))])).clone();
        labelled(&mut hidden.metadata, crate::translate::LABEL_HEADLESS);
        let state = ClusterState {
            services: vec![svc("lb", "LoadBalancer", "Local", Some(32000)), std::sync::Arc::new(headless)],
            endpoint_slices: vec![
                slice("lb-1", "lb", &[80], vec![ep("10.0.0.1", "node-a", Some(true))]),
                std::sync::Arc::new(other),
                std::sync::Arc::new(hidden),
                slice("hl-1", "hl", &[80], vec![ep("10.0.0.4", "node-a", Some(true))]),
            ],
            node: None,
            local_addresses: Vec::new(),
        };
        let hc = health_check_services(&state, "node-a");
        assert_eq!(hc.len(), 1, "{hc:?}");
        assert_eq!((hc[0].port, hc[0].service.name.as_str(), hc[0].local_endpoints), (32000, "lb", 1));
    }
}
