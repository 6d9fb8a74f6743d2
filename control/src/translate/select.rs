//! Endpoint selection for one traffic class of one service port and address family:
//! traffic policies (TP-01..10), the terminating-endpoint fallbacks (TP-06, TP-08), and
//! topology hints (TOPO-01, TOPO-04, TOPO-07..10). This mirrors kube-proxy's
//! `CategorizeEndpoints` / `topologyModeFromHints` (pkg/proxy/topology.go): the hints an
//! EndpointSlice carries are applied whenever every ready endpoint has them, whatever the
//! Service asks for (`trafficDistribution`, `service.kubernetes.io/topology-mode`); asking
//! is the business of the controller that writes the hints (TOPO-02..06, TOPO-12). Without
//! hints, traffic is spread over all endpoints (TOPO-01).

use std::collections::BTreeSet;
use std::net::IpAddr;

use dataplane::tables::EmptyAction;

/// One endpoint of a service port, after joining, conditions and deduplication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ep {
    /// `endpoints[].addresses[0]` (EPS-11).
    pub addr: IpAddr,
    /// Backend port from the slice's `ports[]` (PORT-04).
    pub port: u16,
    /// `conditions.ready` (nil = true; forced true by `publishNotReadyAddresses`, EPS-05).
    pub ready: bool,
    /// `conditions.serving` (nil = true, EPS-06).
    pub serving: bool,
    /// `conditions.terminating` (nil = false, EPS-06).
    pub terminating: bool,
    /// `nodeName` equals this node's name (TP-05).
    pub local: bool,
    /// `hints.forZones[].name`; `None` when there are no zone hints.
    pub zone_hints: Option<BTreeSet<String>>,
    /// `hints.forNodes[].name`; `None` when there are no node hints.
    pub node_hints: Option<BTreeSet<String>>,
}

impl Ep {
    fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

/// A traffic policy (`internalTrafficPolicy` / `externalTrafficPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// `Cluster` (default): every ready endpoint (TP-01).
    Cluster,
    /// `Local`: node-local endpoints only (TP-02, TP-03).
    Local,
}

/// What this node knows about itself for selection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Here<'a> {
    /// This node's name (TP-05).
    pub node: Option<&'a str>,
    /// This node's zone, the Node label `topology.kubernetes.io/zone` (TOPO-10).
    pub zone: Option<&'a str>,
}

/// The outcome of selection for one traffic class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selection {
    /// Per endpoint (same order as the input): eligible for new flows.
    pub eligible: Vec<bool>,
    /// What a new flow gets when nothing is eligible (REJ-01..04).
    pub when_empty: EmptyAction,
    /// Local policy, endpoints exist in the cluster, but none is usable on this node (MET-04).
    pub no_local_endpoints: bool,
}

/// Selects the endpoints one traffic class may send new flows to.
pub(crate) fn select(eps: &[Ep], policy: Policy, here: Here<'_>) -> Selection {
    match policy {
        Policy::Cluster => {
            // TOPO-05: hints only ever narrow the Cluster policy's endpoints.
            let filter = hints_filter(eps, here);
            let avail = |i: usize| filter.as_ref().is_none_or(|f| f[i]);
            let mut eligible: Vec<bool> = eps.iter().enumerate().map(|(i, e)| e.ready && avail(i)).collect();
            if !eligible.contains(&true) {
                // TP-08: no ready endpoint anywhere -> serving terminating ones.
                eligible = eps.iter().enumerate().map(|(i, e)| e.serving_terminating() && avail(i)).collect();
            }
            // REJ-03/REJ-04: nothing usable -> reject (ICMP port unreachable), like kube-proxy.
            Selection { eligible, when_empty: EmptyAction::Reject, no_local_endpoints: false }
        }
        Policy::Local => {
            // TP-10: topology is not used under the Local policy.
            let has_any = eps.iter().any(|e| e.ready || e.serving_terminating());
            let has_local_ready = eps.iter().any(|e| e.local && e.ready);
            let eligible: Vec<bool> = if has_local_ready {
                eps.iter().map(|e| e.local && e.ready).collect()
            } else {
                // TP-06: all local endpoints terminating -> the serving terminating ones.
                eps.iter().map(|e| e.local && e.serving_terminating()).collect()
            };
            let any_local = eligible.contains(&true);
            Selection {
                // REJ-01/REJ-02: endpoints exist but none here -> drop. kube-proxy rejects
                // instead when the service has no usable endpoint at all, and so do we.
                when_empty: if has_any { EmptyAction::Drop } else { EmptyAction::Reject },
                no_local_endpoints: has_any && !any_local,
                eligible,
            }
        }
    }
}

/// The topology filter of the `Cluster` policy from the endpoints' hints (kube-proxy's
/// `topologyModeFromHints` and `availableForTopology`): `None` = use every endpoint.
///
/// Over the ready endpoints: if every one carries `hints.forNodes` and one of them names this
/// node, keep the endpoints hinted for this node (PreferSameNode, TOPO-04); else if every one
/// carries `hints.forZones` and one of them names this node's zone, keep those hinted for the
/// zone (TOPO-07). A ready endpoint without a hint means a transition: no filter of that kind
/// (TOPO-08); no endpoint hinted for us: no filter (TOPO-09); this node's name or zone
/// unknown: nothing can name it, no filter (TOPO-10).
fn hints_filter(eps: &[Ep], here: Here<'_>) -> Option<Vec<bool>> {
    let ready = || eps.iter().filter(|e| e.ready);
    let non_empty = |h: &Option<BTreeSet<String>>| h.as_ref().is_some_and(|h| !h.is_empty());
    let names = |h: &Option<BTreeSet<String>>, n: &str| h.as_ref().is_some_and(|h| h.contains(n));
    if let Some(node) = here.node
        && ready().all(|e| non_empty(&e.node_hints))
        && ready().any(|e| names(&e.node_hints, node))
    {
        return Some(eps.iter().map(|e| names(&e.node_hints, node)).collect());
    }
    if let Some(zone) = here.zone
        && ready().all(|e| non_empty(&e.zone_hints))
        && ready().any(|e| names(&e.zone_hints, zone))
    {
        return Some(eps.iter().map(|e| names(&e.zone_hints, zone)).collect());
    }
    None
}
