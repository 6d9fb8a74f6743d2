//! L2 announcement: this node answers ARP requests (RFC 826) and Neighbor Solicitations (RFC
//! 4861 §7.2.4) for the VIPs it announces, so hosts on the segment send the VIPs' traffic to
//! it, as MetalLB's L2 mode does.
//!
//! The answering is done by the steering program in the driver (`XDP_TX`, see
//! `nic-config/xdp/steer.c`), not here: [`L2`] only fills each interface's `l2_addrs` map
//! ([`nic_config::L2Responder::sync`]) and, for each VIP that was not announced before (this
//! node takes it over: start, health regained, a Service got its first usable endpoint),
//! sends one gratuitous ARP request (RFC 5227 §2.3) or unsolicited Neighbor Advertisement
//! with the Override flag (RFC 4861 §7.2.6) on every answering interface, so neighbours that
//! cached another node's MAC switch at once instead of when their entry goes stale.
//!
//! The same map makes the program drop what is sent to a VIP outside its service ports (and
//! ICMP errors and fragments, which go to xlb): an announced VIP never reaches the host's
//! own sockets.
//!
//! At its first announcement [`L2`] also turns on each program's destination MAC check
//! ([`nic_config::L2Responder::check_destination_mac`]): clients send a VIP's traffic to its
//! owner's MAC, so a unicast frame for another MAC that a switch floods to this node is given
//! to the kernel (which drops it) instead of being forwarded a second time.
//!
//! Which VIPs a node announces is decided outside this module: with several xlb nodes on one
//! segment (Kubernetes mode) each VIP has one owner, [`owner`] over the nodes whose per-node
//! Lease is unexpired ([`crate::k8s::Membership`]), and for a VIP of `externalTrafficPolicy:
//! Local` Services over those of them with a usable endpoint of it on their node ([`owned`]);
//! `xlb run` hands [`L2`] only the VIPs this node owns, so a take-over (another node died or
//! left) is a VIP added to the set here, with its take-over frame, and a hand-back a VIP
//! removed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use nic_config::L2Responder;

use super::{AnnounceError, Announcer, Applied, PrefixSet, Scope};
use crate::cluster::{Changes, ClusterIndex, ServiceRef};
use crate::ipam::Family;

/// The L2 [`Announcer`]: the `l2_addrs` maps of the steering programs of the answering
/// interfaces, and their packet sockets for the take-over frames.
#[derive(Debug)]
pub struct L2 {
    responders: Vec<L2Responder>,
    /// The set last put into every map with its take-over frames sent; `None` before the
    /// first success and after a failure (the next call writes and announces everything).
    owned: Option<PrefixSet>,
    /// Whether the programs' destination MAC check is on (set at the first announcement).
    checking: bool,
}

impl L2 {
    /// An announcer answering through `responders` (one per interface; nothing is written
    /// until [`Announcer::announce`]).
    pub fn new(responders: Vec<L2Responder>) -> Self {
        Self { responders, owned: None, checking: false }
    }

    /// The interfaces answering, comma-separated.
    fn interfaces(&self) -> String {
        let names: Vec<&str> = self.responders.iter().map(L2Responder::ifname).collect();
        if names.is_empty() { "no interface".to_owned() } else { names.join(", ") }
    }
}

impl Drop for L2 {
    /// Turns the destination MAC check off again (the announce mode changed on a reload, or
    /// xlb stops or hands over, when the programs go anyway); errors are only logged.
    fn drop(&mut self) {
        if !self.checking {
            return;
        }
        for r in &mut self.responders {
            if let Err(e) = r.check_destination_mac(false) {
                tracing::debug!(interface = r.ifname(), error = %e, "L2: turning the destination MAC check off");
            }
        }
    }
}

impl Announcer for L2 {
    fn announce(&mut self, set: &PrefixSet) -> Result<Applied, AnnounceError> {
        if self.owned.as_ref() == Some(set) {
            return Ok(Applied::Unchanged);
        }
        if !self.checking {
            // A VIP's traffic is sent to its owner's MAC: frames a switch floods for another
            // node are not this node's to forward.
            for r in &mut self.responders {
                r.check_destination_mac(true).map_err(|source| AnnounceError::L2 { source })?;
            }
            self.checking = true;
        }
        let previous = self.owned.take();
        let addrs: Vec<IpAddr> = set.iter().copied().collect();
        for r in &mut self.responders {
            r.sync(&addrs).map_err(|source| AnnounceError::L2 { source })?;
        }
        let new: Vec<IpAddr> =
            set.iter().filter(|a| !previous.as_ref().is_some_and(|p| p.contains(a))).copied().collect();
        for a in &new {
            for r in &self.responders {
                r.announce(*a).map_err(|source| AnnounceError::L2 { source })?;
            }
        }
        self.owned = Some(set.clone());
        let mut reply = format!("answering ARP/NDP on {} for {set}", self.interfaces());
        if !new.is_empty() {
            let list: Vec<String> = new.iter().map(ToString::to_string).collect();
            let _ = write!(reply, "; gratuitous ARP / unsolicited NA sent for {}", list.join(", "));
        }
        Ok(Applied::Reconfigured { written: true, reply })
    }

    fn describe(&self) -> String {
        format!("ARP/NDP answered by the steering program on {}", self.interfaces())
    }
}

/// The owner of `vip` among `nodes` by rendezvous (highest random weight) hashing: the node
/// whose [`weight`] for `vip` is highest, ties broken by the smaller name. `None` when `nodes`
/// is empty.
///
/// Every node computes the same owner from the same member list, whatever its order, without
/// talking to the others; when a node leaves, only the VIPs it owned move (each to the node
/// with the next highest weight), and a joining node takes over only the VIPs for which it
/// has the highest weight. In Kubernetes mode `xlb run` announces (puts into `l2_addrs`) only
/// the VIPs whose owner over the members of [`crate::k8s::Membership`] (the nodes with an
/// unexpired per-node Lease) that would announce them is this node ([`owned`]); standalone, a
/// node owns every VIP it serves.
pub fn owner<'a>(vip: IpAddr, nodes: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    nodes
        .into_iter()
        .map(|n| (weight(n, vip), n))
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, n)| n)
}

/// The VIPs that only `externalTrafficPolicy: Local` Services would have nodes announce, each
/// with the names of the nodes that would (`endpoints[].nodeName`), sorted by name without
/// repeats ([`local_nodes`]).
pub type LocalNodes = BTreeMap<IpAddr, Vec<Arc<str>>>;

/// The VIPs of `vips` (what this node announces while healthy) that `node` owns among
/// `members`: per VIP, the [`owner`] among the members that would announce it. For a VIP in
/// `local` (only `externalTrafficPolicy: Local` Services make it usable, [`local_nodes`])
/// those are the members with a usable endpoint of it on their node, as MetalLB chooses the
/// L2 owner of such a Service; for any other VIP, every member. Every member computes the same
/// owners from the same members and cluster state.
pub fn owned(vips: &PrefixSet, members: &BTreeSet<String>, node: &str, local: &LocalNodes) -> PrefixSet {
    vips.iter()
        .filter(|v| {
            let has = |nodes: &Vec<Arc<str>>, m: &str| nodes.binary_search_by(|n| (**n).cmp(m)).is_ok();
            let candidates = members.iter().filter(|m| local.get(*v).is_none_or(|nodes| has(nodes, m)));
            owner(**v, candidates.map(String::as_str)) == Some(node)
        })
        .copied()
        .collect()
}

/// The VIPs that only `externalTrafficPolicy: Local` Services would have nodes announce, each
/// with the nodes that would: the addresses of xlb's `scope` (as in [`super::announced`]: the
/// LoadBalancer ingress IPs of its class, and `spec.externalIPs` with `announce.externalIPs`)
/// that no Service of the Cluster policy with a usable endpoint carries, with the nodes (the
/// EndpointSlice endpoints' `nodeName`) that have a usable endpoint of the VIP's family of a
/// Local Service carrying it: one that is ready (or whose Service publishes not-ready
/// addresses), or serving and terminating (TP-06). A VIP left out may be announced by any
/// node; [`owned`] chooses the owner of one listed among its nodes. Walks every Service;
/// [`LocalNodesCache`] keeps the answer from one cluster snapshot to the next and walks only
/// the Services that changed.
pub fn local_nodes(cluster: &ClusterIndex, scope: &Scope<'_>) -> LocalNodes {
    let mut c = LocalNodesCache::default();
    c.update(cluster, &Changes::Full, scope);
    c.nodes
}

/// Interned node names.
type Names = HashSet<Arc<str>, foldhash::fast::RandomState>;

/// What one Service says of one VIP it carries, for [`local_nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// `externalTrafficPolicy: Local`: the nodes with a usable endpoint of the VIP's family.
    Local(Vec<Arc<str>>),
    /// Another policy, with a usable endpoint of the VIP's family: any node may announce it.
    Anywhere,
    /// Another policy, without one.
    Nowhere,
}

/// [`local_nodes`] kept up to date from cluster snapshot to cluster snapshot: after a change
/// of a few Services ([`Changes::Services`]) [`LocalNodesCache::update`] reads only those
/// Services and recomputes only the VIPs they carried or carry; a full change
/// ([`Changes::Full`]: the first snapshot, a relist, a periodic resync) or another `scope`
/// walks every Service again. The answer is always the one [`local_nodes`] gives for the
/// last snapshot passed (`make bench-cp`'s `per_sync.l2_local_nodes` is the full walk).
#[derive(Debug, Default)]
pub struct LocalNodesCache {
    /// The scope of the last update (class, default class, external IPs); `None` before one.
    scope: Option<(Option<String>, bool, bool)>,
    /// Per Service carrying a VIP of the scope: what it says of each.
    parts: HashMap<ServiceRef, Vec<(IpAddr, Part)>, foldhash::fast::RandomState>,
    /// Per VIP: the Services carrying it.
    carriers: BTreeMap<IpAddr, BTreeSet<ServiceRef>>,
    /// Node names, one allocation per node rather than per endpoint.
    names: Names,
    /// The answer.
    nodes: LocalNodes,
}

impl LocalNodesCache {
    /// The VIPs and nodes of [`local_nodes`] for the last snapshot passed to [`Self::update`]
    /// (empty before one).
    #[must_use]
    pub fn nodes(&self) -> &LocalNodes {
        &self.nodes
    }

    /// Forgets everything (a mode without L2 ownership).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Brings the answer to `cluster`, whose Services `changes` names as changed since the
    /// snapshot of the previous update (every Service, if `changes` is full or `scope`
    /// differs from the previous update's).
    pub fn update(&mut self, cluster: &ClusterIndex, changes: &Changes, scope: &Scope<'_>) {
        let key = (scope.class.map(str::to_owned), scope.default_class, scope.external_ips);
        let mut touched: BTreeSet<IpAddr> = BTreeSet::new();
        match changes {
            Changes::Services(set) if self.scope.as_ref() == Some(&key) => {
                for r in set {
                    if let Some(old) = self.parts.remove(r) {
                        for (v, _) in old {
                            if let Some(c) = self.carriers.get_mut(&v) {
                                c.remove(r);
                            }
                            touched.insert(v);
                        }
                    }
                    if let Some(svc) = cluster.service(r) {
                        self.put(cluster, r, svc, scope, &mut touched);
                    }
                }
            }
            _ => {
                *self = Self { scope: Some(key), ..Self::default() };
                for (r, svc) in cluster.services() {
                    self.put(cluster, r, svc, scope, &mut touched);
                }
            }
        }
        for v in touched {
            let carriers = self.carriers.get(&v).filter(|c| !c.is_empty());
            let Some(carriers) = carriers else {
                self.carriers.remove(&v);
                self.nodes.remove(&v);
                continue;
            };
            // Each part's nodes are sorted without repeats: one part's are the answer as they are.
            let mut nodes: Option<Vec<Arc<str>>> = Some(Vec::new());
            let mut merged = 0;
            let said = carriers.iter().filter_map(|r| self.parts.get(r)).flatten().filter(|(w, _)| *w == v);
            for (_, part) in said {
                match (part, nodes.as_mut()) {
                    (Part::Anywhere, _) => nodes = None,
                    (Part::Local(n), Some(nodes)) => {
                        nodes.extend(n.iter().cloned());
                        merged += 1;
                    }
                    _ => {}
                }
            }
            match nodes {
                Some(mut n) => {
                    if merged > 1 {
                        n.sort_unstable();
                        n.dedup();
                    }
                    self.nodes.insert(v, n);
                }
                None => {
                    self.nodes.remove(&v);
                }
            }
        }
    }

    /// Reads what Service `svc` (`r`) says of its VIPs; adds them to `touched`.
    fn put(
        &mut self,
        cluster: &ClusterIndex,
        r: &ServiceRef,
        svc: &Service,
        scope: &Scope<'_>,
        touched: &mut BTreeSet<IpAddr>,
    ) {
        let parts = parts_of(cluster, r, svc, scope, &mut self.names);
        if parts.is_empty() {
            return;
        }
        for (v, _) in &parts {
            self.carriers.entry(*v).or_default().insert(r.clone());
            touched.insert(*v);
        }
        self.parts.insert(r.clone(), parts);
    }
}

/// What Service `svc` (`r`) says of each VIP of `scope` it carries (none: empty); node names
/// are taken from (and added to) `names`.
fn parts_of(
    cluster: &ClusterIndex,
    r: &ServiceRef,
    svc: &Service,
    scope: &Scope<'_>,
    names: &mut Names,
) -> Vec<(IpAddr, Part)> {
    let Some(spec) = svc.spec.as_ref() else { return Vec::new() };
    let mut vips: Vec<IpAddr> = Vec::new();
    let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
    if is_lb && scope.owns_class(spec.load_balancer_class.as_deref()) {
        let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
        vips.extend(ingress.into_iter().flatten().filter_map(|i| crate::translate::parse_ip(i.ip.as_deref()?)));
    }
    if scope.external_ips {
        vips.extend(spec.external_ips.iter().flatten().filter_map(|a| crate::translate::parse_ip(a)));
    }
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let not_ready_too = spec.publish_not_ready_addresses == Some(true);
    vips.into_iter()
        .map(|v| {
            let family = Family::of(v).name();
            let mut usable = cluster
                .slices_of(r)
                .filter(|s| s.address_type == family && crate::translate::proxied(&s.metadata))
                .flat_map(|s| s.endpoints.iter())
                .filter(|e| {
                    let c = crate::translate::conditions_of(e, not_ready_too);
                    c.ready || (c.serving && c.terminating)
                });
            let part = if local {
                let mut n: Vec<Arc<str>> = Vec::with_capacity(cluster.slices_of(r).map(|s| s.endpoints.len()).sum());
                n.extend(usable.filter_map(|e| {
                    let n = e.node_name.as_deref()?;
                    if let Some(a) = names.get(n) {
                        return Some(Arc::clone(a));
                    }
                    let a: Arc<str> = Arc::from(n);
                    names.insert(Arc::clone(&a));
                    Some(a)
                }));
                n.sort_unstable();
                n.dedup();
                Part::Local(n)
            } else if usable.next().is_some() {
                Part::Anywhere
            } else {
                Part::Nowhere
            };
            (v, part)
        })
        .collect()
}

/// The rendezvous weight of `node` for `vip`: 64-bit FNV-1a over the node name, a 0 byte and
/// the address's 16-byte form (IPv4 as `::ffff:a.b.c.d`), finished with the SplitMix64 mixer.
/// Fixed by this definition, so every xlb version and process computes the same weights.
#[must_use]
pub fn weight(node: &str, vip: IpAddr) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let addr = match vip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    let mut h = OFFSET;
    for b in node.as_bytes().iter().chain(&[0u8]).chain(&addr) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vips(n: u32) -> Vec<IpAddr> {
        (0..n).map(|i| IpAddr::from(std::net::Ipv4Addr::from(0xc633_6400 + i))).collect()
    }

    #[test]
    fn the_owner_does_not_depend_on_the_order_of_the_members() {
        let a = ["node-a", "node-b", "node-c"];
        let b = ["node-c", "node-a", "node-b"];
        for v in vips(200) {
            assert_eq!(owner(v, a), owner(v, b), "{v}");
            assert!(owner(v, a).is_some());
        }
        assert_eq!(owner(vips(1)[0], []), None, "no member, no owner");
    }

    #[test]
    fn a_leaving_node_moves_only_its_own_vips() {
        let all = ["node-a", "node-b", "node-c"];
        let without_b = ["node-a", "node-c"];
        let mut moved = 0;
        for v in vips(300) {
            let before = owner(v, all).unwrap();
            let after = owner(v, without_b).unwrap();
            if before == "node-b" {
                moved += 1;
            } else {
                assert_eq!(before, after, "{v} was not node-b's and must stay");
            }
        }
        assert!(moved > 0);
    }

    #[test]
    fn vips_spread_over_the_nodes() {
        let nodes = ["node-a", "node-b", "node-c"];
        let mut count = std::collections::HashMap::new();
        for v in vips(3000) {
            *count.entry(owner(v, nodes).unwrap()).or_insert(0) += 1;
        }
        for n in nodes {
            let c = count.get(n).copied().unwrap_or(0);
            assert!((800..=1200).contains(&c), "{n} owns {c} of 3000: {count:?}");
        }
    }

    #[test]
    fn weights_are_fixed_by_definition() {
        // Pinned so that a change of the hash (which would move VIPs between nodes of
        // different versions during an upgrade) fails here.
        let w = weight("node-a", "192.0.2.1".parse().unwrap());
        assert_eq!(w, weight("node-a", "::ffff:192.0.2.1".parse().unwrap()), "IPv4 as its mapped form");
        assert_ne!(w, weight("node-b", "192.0.2.1".parse().unwrap()));
        assert_eq!(w, PINNED, "weight(\"node-a\", 192.0.2.1) = {w:#x}");
    }

    /// Computed independently of this code (Python, from the definition in [`weight`]).
    const PINNED: u64 = 0x5479_fbcc_3f85_d354;
}
