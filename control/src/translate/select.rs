//! Endpoint selection for one traffic class of one service port and address family:
//! traffic policies (TP-01..10), the terminating-endpoint fallbacks (TP-06, TP-08), and
//! topology (TOPO-01..12). This mirrors kube-proxy's `CategorizeEndpoints` /
//! `topologyModeFromHints` (pkg/proxy/topology.go), extended so that `trafficDistribution`
//! also works without a controller writing hints (standalone mode).

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
    /// `endpoints[].zone`.
    pub zone: Option<String>,
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

/// Which topology preference applies to a service (only under the `Cluster` policy, TOPO-05).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topology {
    /// No preference: all endpoints (TOPO-01).
    Off,
    /// `service.kubernetes.io/topology-mode: Auto` (TOPO-06) or the legacy
    /// `service.kubernetes.io/topology-aware-hints: auto` (TOPO-12): zone hints only.
    Auto,
    /// `trafficDistribution: PreferSameZone` or its alias `PreferClose` (TOPO-02, TOPO-03).
    SameZone,
    /// `trafficDistribution: PreferSameNode` (TOPO-04).
    SameNode,
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
pub(crate) fn select(eps: &[Ep], policy: Policy, topology: Topology, here: Here<'_>) -> Selection {
    match policy {
        Policy::Cluster => {
            let filter = topology_filter(eps, topology, here);
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

/// The topology filter for the `Cluster` policy: `None` = use every endpoint.
fn topology_filter(eps: &[Ep], topology: Topology, here: Here<'_>) -> Option<Vec<bool>> {
    match topology {
        Topology::Off => None,
        Topology::Auto => zone_filter(eps, here, false),
        Topology::SameZone => zone_filter(eps, here, true),
        Topology::SameNode => node_filter(eps, here).or_else(|| zone_filter(eps, here, true)),
    }
}

/// Keeps a filter only if it leaves at least one ready endpoint; otherwise the caller falls
/// back to the next level (TOPO-02, TOPO-04, TOPO-09).
fn keep_if_ready_match(eps: &[Ep], f: Vec<bool>) -> Option<Vec<bool>> {
    eps.iter().zip(&f).any(|(e, &m)| m && e.ready).then_some(f)
}

/// PreferSameNode (TOPO-04): `hints.forNodes` when every ready endpoint has them, else the
/// endpoint's `nodeName` when no ready endpoint has them; mixed = a transition, skip to zone.
fn node_filter(eps: &[Ep], here: Here<'_>) -> Option<Vec<bool>> {
    let node = here.node?;
    let ready: Vec<&Ep> = eps.iter().filter(|e| e.ready).collect();
    if ready.is_empty() {
        return None;
    }
    let hinted = ready.iter().filter(|e| e.node_hints.is_some()).count();
    let f: Vec<bool> = if hinted == ready.len() {
        eps.iter().map(|e| e.node_hints.as_ref().is_some_and(|h| h.contains(node))).collect()
    } else if hinted == 0 {
        eps.iter().map(|e| e.local).collect()
    } else {
        return None;
    };
    keep_if_ready_match(eps, f)
}

/// Zone preference: hints first (TOPO-07..10); with `field_fallback`, the endpoint's `zone`
/// when no ready endpoint carries a zone hint (trafficDistribution without a hints writer).
fn zone_filter(eps: &[Ep], here: Here<'_>, field_fallback: bool) -> Option<Vec<bool>> {
    // TOPO-10: zone of this node unknown -> no zone filtering.
    let zone = here.zone?;
    let ready: Vec<&Ep> = eps.iter().filter(|e| e.ready).collect();
    if ready.is_empty() {
        return None;
    }
    let hinted = ready.iter().filter(|e| e.zone_hints.is_some()).count();
    let f: Vec<bool> = if hinted == ready.len() {
        // TOPO-07: keep endpoints whose hints name this zone.
        eps.iter().map(|e| e.zone_hints.as_ref().is_some_and(|h| h.contains(zone))).collect()
    } else if hinted > 0 {
        // TOPO-08: some endpoint lacks a hint -> transition, use all endpoints.
        return None;
    } else if field_fallback {
        eps.iter().map(|e| e.zone.as_deref() == Some(zone)).collect()
    } else {
        // Auto without hints: the controller chose not to write any (TOPO-11).
        return None;
    };
    // TOPO-09: no endpoint for this zone -> all zones.
    keep_if_ready_match(eps, f)
}
