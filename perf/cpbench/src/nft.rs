//! The nftables ruleset kube-proxy's nftables mode programs, as the `nft -f` transaction text
//! its knftables library writes (`add table …`, `add chain …` + `flush chain …`, `add rule …`,
//! `add element …`).
//!
//! Structure, names and rules follow `pkg/proxy/nftables/proxier.go` (kubernetes/kubernetes):
//! - `setupNFTables`: the `kube-proxy` table per family, the base chains (`nftablesBaseChains`:
//!   `filter-prerouting/input/forward/output` at dstnat-10, `filter-output-post-dnat` at
//!   dstnat+10, `nat-prerouting`/`nat-output` at dstnat, `nat-postrouting` at srcnat), the
//!   jumps of `nftablesJumpChains`, `mark-for-masquerade` (`mark set mark or 0x4000`),
//!   `masquerading` (`masquerade fully-random` for marked packets), the `cluster-ips` set and
//!   `cluster-ips-check`, the `nodeport-ips` set, the `no-endpoint-services` /
//!   `no-endpoint-nodeports` verdict maps with `reject-chain`, `firewall-ips` /
//!   `firewall-check`, and the `service-ips` / `service-nodeports` dispatch maps;
//! - `syncProxyRules`: per service port the `service-HASH-…` (Cluster policy) and
//!   `local-HASH-…` (Local policy) chains with `numgen random mod N vmap { … }`
//!   (`writeServiceToEndpointRules`), `external-HASH-…` (masquerade for a Cluster external
//!   policy, short-circuit of local traffic for a Local one), `firewall-HASH-…` for
//!   `loadBalancerSourceRanges`, the per-endpoint `endpoint-HASH-…` chains (hairpin
//!   masquerade + DNAT) and the `affinity-HASH-…` sets for ClientIP affinity;
//! - the partial sync (`tryPartialSync`, `nftElementStorage.ensureElem` /
//!   `cleanupLeftoverKeys`): only the chains of changed services are rewritten, map elements
//!   are added / deleted by difference, stale chains are flushed and deleted a second later.
//!
//! Not modelled: the local-traffic detector (`clusterCIDR`; its rules need the pod CIDR, which
//! a [`TablesSpec`] does not carry), `serviceCIDRs` drops, health-check node ports, and DSR
//! (kube-proxy has none; DSR services are programmed as NAT here).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use dataplane::tables::TablesSpec;

use crate::model::{ModelError, ServicePort, service_ports};
use crate::names;

/// kube-proxy's default masquerade mark: bit 14 (`masqueradeBit`), printed `%#08x`.
pub const MASQUERADE_MARK: &str = "0x004000";

/// Per-family spelling (`ipX`, `ipvX_addr`, `noLocalhost` in `setupNFTables`).
#[derive(Debug, Clone, Copy)]
struct Fam {
    table: &'static str,
    ipx: &'static str,
    addr_type: &'static str,
    no_localhost: &'static str,
}

const V4: Fam = Fam { table: "ip", ipx: "ip", addr_type: "ipv4_addr", no_localhost: "ip daddr != 127.0.0.0/8" };
const V6: Fam = Fam { table: "ip6", ipx: "ip6", addr_type: "ipv6_addr", no_localhost: "ip6 daddr != ::1" };

/// One element of a kube-proxy set or verdict map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    /// Set or map name (`service-ips`, `cluster-ips`, …).
    pub container: &'static str,
    /// Key, ` . `-joined as nft prints it.
    pub key: String,
    /// Verdict for maps (`goto service-…`, `drop`); `None` for sets.
    pub value: Option<String>,
    /// Element comment (kube-proxy comments the no-endpoint elements with the port name).
    pub comment: Option<String>,
}

impl Element {
    fn text(&self) -> String {
        let mut s = self.key.clone();
        if let Some(c) = &self.comment {
            let _ = write!(s, " comment \"{c}\"");
        }
        if let Some(v) = &self.value {
            let _ = write!(s, " : {v}");
        }
        s
    }
}

/// Everything one service port owns in the `kube-proxy` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortObjects {
    /// Chains in creation order (endpoint chains first, as `ensureChain` is called), each
    /// with its rules in order.
    pub chains: Vec<(String, Vec<String>)>,
    /// ClientIP affinity sets: (name, timeout in seconds).
    pub affinity_sets: Vec<(String, u32)>,
    /// Set and map elements.
    pub elements: Vec<Element>,
}

impl PortObjects {
    fn chain(&mut self, name: &str) -> &mut Vec<String> {
        let i = match self.chains.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                self.chains.push((name.to_owned(), Vec::new()));
                self.chains.len() - 1
            }
        };
        &mut self.chains[i].1
    }
}

fn endpoint_str(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// The chains, sets and elements kube-proxy's `syncProxyRules` writes for one service port.
pub fn port_objects(sp: &ServicePort) -> PortObjects {
    let fam = if sp.ipv6 { V6 } else { V4 };
    let proto = sp.protocol();
    let n = &sp.name;
    let base = names::nft_service_port_base(&n.namespace, &n.name, proto, &n.port);
    let cluster_chain = format!("service-{base}");
    let local_chain = format!("local-{base}");
    let external_chain = format!("external-{base}");
    let fw_chain = format!("firewall-{base}");
    let ep_base = |(ip, port): (IpAddr, u16)| names::nft_endpoint_base(&n.namespace, &n.name, proto, &n.port, ip, port);
    let ep_chain = |ep: (IpAddr, u16)| format!("endpoint-{}", ep_base(ep));
    let aff_set = |ep: (IpAddr, u16)| format!("affinity-{}", ep_base(ep));
    let spn = n.service_port_name();

    let mut o = PortObjects::default();
    let all_eps = sp.all_endpoints();
    for ep in &all_eps {
        o.chain(&ep_chain(*ep));
    }
    let cluster_eps = sp.cluster_endpoints().filter(|e| !e.is_empty());
    let local_eps = sp.local_endpoints().filter(|e| !e.is_empty());
    if cluster_eps.is_some() {
        o.chain(&cluster_chain);
    }
    if local_eps.is_some() {
        o.chain(&local_chain);
    }
    let has_endpoints = sp.has_endpoints();
    let has_internal = !sp.internal.endpoints.is_empty();
    let has_external = !sp.external.endpoints.is_empty();
    let internal_chain = if sp.internal_local { &local_chain } else { &cluster_chain };
    let external_policy_chain = if sp.external_local { &local_chain } else { &cluster_chain };
    let uses_external = has_endpoints && sp.externally_accessible();
    if uses_external {
        o.chain(&external_chain);
    }
    let uses_fw = !sp.lb_ips.is_empty() && !sp.source_ranges.is_empty();
    if uses_fw {
        o.chain(&fw_chain);
    }
    let (int_verdict, ext_verdict) =
        if has_endpoints { ("drop", "drop") } else { ("goto reject-chain", "goto reject-chain") };

    // Dispatch and no-endpoint elements.
    let el = |container: &'static str, key: String, value: Option<String>, comment: bool| Element {
        container,
        key,
        value,
        comment: comment.then(|| spn.clone()),
    };
    if let Some((cip, port)) = sp.cluster_ip {
        o.elements.push(el("cluster-ips", cip.to_string(), None, false));
        let key = format!("{cip} . {proto} . {port}");
        if has_internal {
            o.elements.push(el("service-ips", key, Some(format!("goto {internal_chain}")), false));
        } else {
            o.elements.push(el("no-endpoint-services", key, Some(int_verdict.into()), true));
        }
    }
    for (ip, port) in &sp.external_ips {
        let key = format!("{ip} . {proto} . {port}");
        if has_endpoints {
            o.elements.push(el("service-ips", key.clone(), Some(format!("goto {external_chain}")), false));
        }
        if !has_external {
            o.elements.push(el("no-endpoint-services", key, Some(ext_verdict.into()), true));
        }
    }
    for (ip, port) in &sp.lb_ips {
        let key = format!("{ip} . {proto} . {port}");
        if has_endpoints {
            o.elements.push(el("service-ips", key.clone(), Some(format!("goto {external_chain}")), false));
        }
        if uses_fw {
            o.elements.push(el("firewall-ips", key.clone(), Some(format!("goto {fw_chain}")), false));
        }
        if !has_external {
            o.elements.push(el("no-endpoint-services", key, Some(ext_verdict.into()), true));
        }
    }
    if let Some(np) = sp.node_port {
        let key = format!("{proto} . {np}");
        if has_endpoints {
            o.elements.push(el("service-nodeports", key.clone(), Some(format!("goto {external_chain}")), false));
        }
        if !has_external {
            o.elements.push(el("no-endpoint-nodeports", key, Some(ext_verdict.into()), true));
        }
    }

    // Internal traffic: masqueradeAll marks ClusterIP flows in the internal policy chain.
    if has_internal
        && sp.internal.masquerade
        && let Some((cip, port)) = sp.cluster_ip
    {
        let ipx = fam.ipx;
        o.chain(internal_chain).push(format!("{ipx} daddr {cip} {proto} dport {port} jump mark-for-masquerade"));
    }
    // External traffic.
    if uses_external {
        let rules = o.chain(&external_chain);
        if !sp.external_local {
            rules.push("jump mark-for-masquerade".into());
        } else {
            rules.push("fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"".into());
            if cluster_eps.is_some() {
                rules
                    .push(format!("fib saddr type local goto {cluster_chain} comment \"short-circuit local traffic\""));
            }
        }
        if has_external {
            o.chain(&external_chain).push(format!("goto {external_policy_chain}"));
        }
    }
    if uses_fw {
        let ranges: Vec<String> = sp.source_ranges.iter().map(ToString::to_string).collect();
        o.chain(&fw_chain).push(format!("{} saddr != {{ {} }} drop", fam.ipx, ranges.join(", ")));
    }
    if let Some(t) = sp.affinity_timeout_s {
        for ep in &all_eps {
            o.affinity_sets.push((aff_set(*ep), t));
        }
    }
    // writeServiceToEndpointRules for the Cluster and Local policy chains.
    for (chain, eps) in [(&cluster_chain, cluster_eps), (&local_chain, local_eps)] {
        let Some(eps) = eps else { continue };
        let mut rules = Vec::new();
        if sp.affinity_timeout_s.is_some() {
            for ep in eps {
                rules.push(format!("{} saddr @{} goto {}", fam.ipx, aff_set(*ep), ep_chain(*ep)));
            }
        }
        let vmap: Vec<String> = eps.iter().enumerate().map(|(i, ep)| format!("{i} : goto {}", ep_chain(*ep))).collect();
        rules.push(format!("numgen random mod {} vmap {{ {} }}", eps.len(), vmap.join(", ")));
        o.chain(chain).extend(rules);
    }
    // Endpoint chains: hairpin masquerade, affinity update, DNAT.
    for ep in &all_eps {
        let chain = ep_chain(*ep);
        let mut rules = vec![format!("{} saddr {} jump mark-for-masquerade", fam.ipx, ep.0)];
        if sp.affinity_timeout_s.is_some() {
            rules.push(format!("update @{} {{ {} saddr }}", aff_set(*ep), fam.ipx));
        }
        rules.push(format!("meta l4proto {proto} dnat to {}", endpoint_str(ep.0, ep.1)));
        o.chain(&chain).extend(rules);
    }
    o
}

/// Names of the base chains with their type, hook and numeric priority
/// (`nftablesBaseChains`: dstnat = -100, srcnat = 100).
const BASE_CHAINS: &[(&str, &str, &str, i32)] = &[
    ("filter-prerouting", "filter", "prerouting", -110),
    ("filter-input", "filter", "input", -110),
    ("filter-forward", "filter", "forward", -110),
    ("filter-output", "filter", "output", -110),
    ("filter-output-post-dnat", "filter", "output", -90),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
];

/// `nftablesJumpChains`: (destination, source, extra match).
const JUMP_CHAINS: &[(&str, &str, &str)] = &[
    ("nodeport-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-forward", "ct state new "),
    ("service-endpoints-check", "filter-output", "ct state new "),
    ("firewall-check", "filter-prerouting", "ct state new "),
    ("firewall-check", "filter-output", "ct state new "),
    ("services", "nat-output", ""),
    ("services", "nat-prerouting", ""),
    ("masquerading", "nat-postrouting", ""),
    ("cluster-ips-check", "filter-forward", "ct state new "),
    ("cluster-ips-check", "filter-output-post-dnat", "ct state new "),
];

/// The containers kube-proxy flushes at a full sync (its `nftElementStorage`s).
const CONTAINERS: &[(&str, &str)] = &[
    ("set", "cluster-ips"),
    ("map", "service-ips"),
    ("map", "firewall-ips"),
    ("map", "no-endpoint-services"),
    ("map", "no-endpoint-nodeports"),
    ("map", "service-nodeports"),
];

/// `setupNFTables` for one family. `node_port_ips` empty = every local address
/// (`nodePortAddresses.MatchAll()`), else the `nodeport-ips` set.
fn setup(out: &mut String, fam: Fam, node_port_ips: &BTreeSet<IpAddr>) {
    let t = format!("{} kube-proxy", fam.table);
    let _ = writeln!(out, "add table {t} {{ comment \"rules for kube-proxy\" ; }}");
    for (name, ty, hook, prio) in BASE_CHAINS {
        let _ = writeln!(out, "add chain {t} {name} {{ type {ty} hook {hook} priority {prio} ; }}");
        let _ = writeln!(out, "flush chain {t} {name}");
    }
    let mut created: BTreeSet<&str> = BTreeSet::new();
    let mut ensure = |out: &mut String, c: &'static str| {
        if created.insert(c) {
            let _ = writeln!(out, "add chain {t} {c}");
            let _ = writeln!(out, "flush chain {t} {c}");
        }
    };
    for (dst, src, extra) in JUMP_CHAINS {
        ensure(out, dst);
        let _ = writeln!(out, "add rule {t} {src} {extra}jump {dst}");
    }
    for c in ["services", "cluster-ips-check", "masquerading", "mark-for-masquerade"] {
        ensure(out, c);
    }
    let m = MASQUERADE_MARK;
    let _ = writeln!(out, "add rule {t} mark-for-masquerade mark set mark or {m}");
    let _ = writeln!(out, "add rule {t} masquerading mark and {m} == 0 return");
    let _ = writeln!(out, "add rule {t} masquerading mark set mark xor {m}");
    let _ = writeln!(out, "add rule {t} masquerading masquerade fully-random");
    let at = fam.addr_type;
    let ipx = fam.ipx;
    let _ = writeln!(out, "add set {t} cluster-ips {{ type {at} ; comment \"Active ClusterIPs\" ; }}");
    let _ = writeln!(
        out,
        "add rule {t} cluster-ips-check {ipx} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
    );
    let match_all = node_port_ips.is_empty();
    let _ = writeln!(out, "add set {t} nodeport-ips {{ type {at} ; comment \"IPs that accept NodePort traffic\" ; }}");
    if match_all {
        let _ = writeln!(out, "delete set {t} nodeport-ips");
    } else {
        let _ = writeln!(out, "flush set {t} nodeport-ips");
        let ips: Vec<String> = node_port_ips.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "add element {t} nodeport-ips {{ {} }}", ips.join(", "));
    }
    let _ = writeln!(
        out,
        "add map {t} no-endpoint-services {{ type {at} . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}"
    );
    let _ = writeln!(
        out,
        "add map {t} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}"
    );
    let _ = writeln!(
        out,
        "add chain {t} reject-chain {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"
    );
    let _ = writeln!(out, "flush chain {t} reject-chain");
    let _ = writeln!(out, "add rule {t} reject-chain reject");
    let _ = writeln!(
        out,
        "add rule {t} service-endpoints-check {ipx} daddr . meta l4proto . th dport vmap @no-endpoint-services"
    );
    let nl = fam.no_localhost;
    if match_all {
        let _ = writeln!(
            out,
            "add rule {t} nodeport-endpoints-check {nl} meta l4proto . th dport vmap @no-endpoint-nodeports"
        );
    } else {
        let _ = writeln!(
            out,
            "add rule {t} nodeport-endpoints-check {ipx} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"
        );
    }
    let _ = writeln!(
        out,
        "add map {t} firewall-ips {{ type {at} . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}"
    );
    let _ = writeln!(out, "add rule {t} firewall-check {ipx} daddr . meta l4proto . th dport vmap @firewall-ips");
    let _ = writeln!(
        out,
        "add map {t} service-ips {{ type {at} . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}"
    );
    let _ = writeln!(
        out,
        "add map {t} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}"
    );
    let _ = writeln!(out, "add rule {t} services {ipx} daddr . meta l4proto . th dport vmap @service-ips");
    if match_all {
        let _ = writeln!(
            out,
            "add rule {t} services fib daddr type local {nl} meta l4proto . th dport vmap @service-nodeports"
        );
    } else {
        let _ = writeln!(
            out,
            "add rule {t} services {ipx} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"
        );
    }
    for (kind, name) in CONTAINERS {
        let _ = writeln!(out, "flush {kind} {t} {name}");
    }
}

fn write_chain_decls(out: &mut String, t: &str, o: &PortObjects) {
    for (c, _) in &o.chains {
        let _ = writeln!(out, "add chain {t} {c}");
        let _ = writeln!(out, "flush chain {t} {c}");
    }
    for (s, timeout) in &o.affinity_sets {
        let _ =
            writeln!(out, "add set {t} {s} {{ type {} ; flags dynamic,timeout ; timeout {timeout}s ; }}", addr_type(t));
    }
}

fn addr_type(t: &str) -> &'static str {
    if t.starts_with("ip6 ") { V6.addr_type } else { V4.addr_type }
}

/// Rules in `syncProxyRules` order: the service's own chains (internal masquerade, external,
/// firewall, policy chains), then the endpoint chains.
fn write_rules(out: &mut String, t: &str, o: &PortObjects) {
    let (eps, own): (Vec<_>, Vec<_>) = o.chains.iter().partition(|(c, _)| c.starts_with("endpoint-"));
    for (c, rules) in own.into_iter().chain(eps) {
        for r in rules {
            let _ = writeln!(out, "add rule {t} {c} {r}");
        }
    }
}

fn write_element(out: &mut String, t: &str, verb: &str, e: &Element) {
    let text = if verb == "delete" { e.key.clone() } else { e.text() };
    let _ = writeln!(out, "{verb} element {t} {} {{ {text} }}", e.container);
}

fn by_family(ports: Vec<ServicePort>) -> [(Fam, Vec<ServicePort>); 2] {
    let (v6, v4): (Vec<_>, Vec<_>) = ports.into_iter().partition(|p| p.ipv6);
    [(V4, v4), (V6, v6)]
}

/// The full-sync transaction kube-proxy's nftables mode runs for `spec`: `table ip
/// kube-proxy`, plus `table ip6 kube-proxy` when the spec has IPv6 services. Load it with
/// `nft -f`.
///
/// # Errors
/// [`ModelError`] for spec names `build_spec` never produces.
pub fn nft_ruleset(spec: &TablesSpec) -> Result<String, ModelError> {
    let mut out = String::new();
    for (i, (fam, ports)) in by_family(service_ports(spec, None)?).into_iter().enumerate() {
        if i > 0 && ports.is_empty() {
            continue;
        }
        let t = format!("{} kube-proxy", fam.table);
        let np: BTreeSet<IpAddr> = ports.iter().flat_map(|p| p.node_port_addrs.iter().copied()).collect();
        setup(&mut out, fam, &np);
        for sp in &ports {
            let o = port_objects(sp);
            write_chain_decls(&mut out, &t, &o);
            for e in &o.elements {
                write_element(&mut out, &t, "add", e);
            }
            write_rules(&mut out, &t, &o);
        }
    }
    Ok(out)
}

/// What kube-proxy's partial sync does when one Service changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftUpdate {
    /// The sync transaction: the Service's chains re-added, flushed and rewritten, map and set
    /// elements added / deleted by difference (`nftElementStorage.ensureElem`,
    /// `cleanupLeftoverKeys`), chains it no longer uses flushed, and affinity sets it no
    /// longer uses deleted.
    pub transaction: String,
    /// The transaction of a later sync that deletes the flushed stale chains (kube-proxy
    /// waits a second: older kernels notice only late that a chain lost its last reference).
    pub deferred: String,
    /// Number of chains rewritten.
    pub chains_written: usize,
    /// Number of element additions plus deletions.
    pub element_ops: usize,
}

/// The partial-sync transaction for Service `service` (`namespace/name`) going from `old`
/// to `new`, to run with `nft -f` on a table that holds the full ruleset of `old`.
///
/// # Errors
/// [`ModelError`] for spec names `build_spec` never produces.
pub fn nft_service_update(old: &TablesSpec, new: &TablesSpec, service: &str) -> Result<NftUpdate, ModelError> {
    let mut u = NftUpdate::default();
    let old_all = by_family(service_ports(old, None)?);
    let old_ports = by_family(service_ports(old, Some(service))?);
    let new_ports = by_family(service_ports(new, Some(service))?);
    for ((fam, olds), ((_, news), (_, old_family))) in old_ports.into_iter().zip(new_ports.into_iter().zip(old_all)) {
        if olds.is_empty() && news.is_empty() {
            continue;
        }
        let t = format!("{} kube-proxy", fam.table);
        if old_family.is_empty() {
            // The family's table does not exist yet: a full sync of it.
            let np: BTreeSet<IpAddr> = news.iter().flat_map(|p| p.node_port_addrs.iter().copied()).collect();
            setup(&mut u.transaction, fam, &np);
        }
        let old_o: Vec<PortObjects> = olds.iter().map(port_objects).collect();
        let new_o: Vec<PortObjects> = news.iter().map(port_objects).collect();
        let old_el: BTreeMap<(&str, &str), &Element> =
            old_o.iter().flat_map(|o| &o.elements).map(|e| ((e.container, e.key.as_str()), e)).collect();
        let new_el: BTreeMap<(&str, &str), &Element> =
            new_o.iter().flat_map(|o| &o.elements).map(|e| ((e.container, e.key.as_str()), e)).collect();
        for o in &new_o {
            write_chain_decls(&mut u.transaction, &t, o);
            u.chains_written += o.chains.len();
        }
        for (k, e) in &new_el {
            match old_el.get(k) {
                Some(prev) if prev.value == e.value => {}
                Some(_) => {
                    write_element(&mut u.transaction, &t, "delete", e);
                    write_element(&mut u.transaction, &t, "add", e);
                    u.element_ops += 2;
                }
                None => {
                    write_element(&mut u.transaction, &t, "add", e);
                    u.element_ops += 1;
                }
            }
        }
        for (k, e) in &old_el {
            if !new_el.contains_key(k) {
                write_element(&mut u.transaction, &t, "delete", e);
                u.element_ops += 1;
            }
        }
        for o in &new_o {
            write_rules(&mut u.transaction, &t, o);
        }
        let new_chains: BTreeSet<&str> = new_o.iter().flat_map(|o| o.chains.iter().map(|(c, _)| c.as_str())).collect();
        for c in old_o.iter().flat_map(|o| o.chains.iter().map(|(c, _)| c.as_str())) {
            if !new_chains.contains(c) {
                let _ = writeln!(u.transaction, "flush chain {t} {c}");
                let _ = writeln!(u.deferred, "delete chain {t} {c}");
            }
        }
        let new_sets: BTreeSet<&str> =
            new_o.iter().flat_map(|o| o.affinity_sets.iter().map(|(s, _)| s.as_str())).collect();
        for s in old_o.iter().flat_map(|o| o.affinity_sets.iter().map(|(s, _)| s.as_str())) {
            if !new_sets.contains(s) {
                let _ = writeln!(u.transaction, "delete set {t} {s}");
            }
        }
    }
    Ok(u)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const HEAD: &str =
        "apiVersion: xlb.dev/v1alpha1\nkind: XlbConfiguration\nnodeName: n1\nnodeAddresses: [192.168.0.10]\n";

    /// A Service `name` with cluster IP `ip`, one TCP port 80 -> 8080, and `spec_extra`
    /// appended to its spec; plus its slice with `eps` (address, ready, node).
    pub(crate) fn svc(name: &str, ip: &str, spec_extra: &str, eps: &[(&str, bool, &str)]) -> String {
        let mut s = format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}}]\n{spec_extra}"
        );
        if !eps.is_empty() {
            let _ = write!(
                s,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: ns, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n"
            );
            for (a, ready, node) in eps {
                let _ = writeln!(s, "- {{addresses: [{a}], conditions: {{ready: {ready}}}, nodeName: {node}}}");
            }
        }
        s
    }

    pub(crate) fn spec(docs: &str) -> TablesSpec {
        let l = xlb::file_source::load_str(&format!("{HEAD}{docs}"), "test").unwrap();
        let (spec, report) = xlb::translate::build_spec(&l.cluster, &l.config).unwrap();
        assert!(!report.has_errors(), "{:?}", report.issues);
        spec
    }

    /// Rules of the per-service chains whose name starts with `chain_prefix` (service chains
    /// contain a `/`, kube-proxy's `isServiceChainName`).
    fn rules_of<'a>(text: &'a str, chain_prefix: &str) -> Vec<&'a str> {
        let head = format!("add rule ip kube-proxy {chain_prefix}");
        text.lines()
            .filter(|l| l.starts_with(&head) && l[head.len()..].split(' ').next().is_some_and(|c| c.contains('/')))
            .collect()
    }

    #[test]
    fn two_ready_endpoints_give_a_mod_2_vmap_and_dnat_to_exactly_the_eligible_backends() {
        let s = spec(&svc(
            "web",
            "10.96.0.10",
            "",
            &[("10.244.0.1", true, "n2"), ("10.244.0.2", true, "n3"), ("10.244.0.3", false, "n4")],
        ));
        let text = nft_ruleset(&s).unwrap();
        let numgen: Vec<&str> = text.lines().filter(|l| l.contains("numgen random")).collect();
        assert_eq!(numgen.len(), 1, "{numgen:?}");
        assert!(numgen[0].contains("numgen random mod 2 vmap { 0 : goto endpoint-"), "{}", numgen[0]);
        assert_eq!(numgen[0].matches("goto endpoint-").count(), 2);
        let mut dnat: Vec<&str> = text.lines().filter_map(|l| l.split_once(" dnat to ").map(|(_, t)| t)).collect();
        dnat.sort_unstable();
        assert_eq!(dnat, ["10.244.0.1:8080", "10.244.0.2:8080"], "the not-ready endpoint gets no DNAT");
        assert!(text.contains("add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto service-"));
        assert!(text.contains("add element ip kube-proxy cluster-ips { 10.96.0.10 }"));
        // Hairpin: each endpoint masquerades its own traffic.
        assert_eq!(rules_of(&text, "endpoint-").iter().filter(|r| r.contains("jump mark-for-masquerade")).count(), 2);
        // The base structure.
        for needle in [
            "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
            "add rule ip kube-proxy nat-prerouting jump services",
            "add rule ip kube-proxy nat-output jump services",
            "add rule ip kube-proxy nat-postrouting jump masquerading",
            "add rule ip kube-proxy mark-for-masquerade mark set mark or 0x004000",
            "add rule ip kube-proxy masquerading masquerade fully-random",
            "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ;",
        ] {
            assert!(text.contains(needle), "missing {needle:?}");
        }
        assert!(!text.contains("ip6 kube-proxy"), "no IPv6 table without IPv6 services");
    }

    #[test]
    fn nodeport_with_cluster_policy_is_marked_for_masquerade() {
        let s = spec(&svc("np", "10.96.0.11", "  type: NodePort\n", &[("10.244.0.1", true, "n2")]));
        let text = nft_ruleset(&s).unwrap();
        let ext = rules_of(&text, "external-");
        assert!(ext[0].ends_with(" jump mark-for-masquerade"), "{ext:?}");
        assert!(ext[1].contains(" goto service-"), "{ext:?}");
        assert!(text.contains("add element ip kube-proxy service-nodeports { tcp . 30080 : goto external-"));
        assert!(text.contains("add element ip kube-proxy nodeport-ips { 192.168.0.10 }"));
    }

    #[test]
    fn local_external_policy_keeps_the_client_address_and_uses_the_local_chain() {
        let s = spec(&svc(
            "loc",
            "10.96.0.12",
            "  type: NodePort\n  externalTrafficPolicy: Local\n",
            &[("10.244.0.1", true, "n1"), ("10.244.0.2", true, "n2")],
        ));
        let text = nft_ruleset(&s).unwrap();
        let ext = rules_of(&text, "external-");
        assert!(ext.iter().all(|r| !r.ends_with("external-") && !r.ends_with(" jump mark-for-masquerade")), "{ext:?}");
        assert!(ext.iter().any(|r| r.contains("fib saddr type local jump mark-for-masquerade")), "{ext:?}");
        assert!(ext.last().unwrap().contains(" goto local-"), "{ext:?}");
        let local = rules_of(&text, "local-");
        assert_eq!(local.len(), 1);
        assert!(local[0].contains("numgen random mod 1 vmap") && local[0].contains("10.244.0.1/8080"), "{local:?}");
        let cluster = rules_of(&text, "service-");
        assert!(cluster[0].contains("numgen random mod 2"), "ClusterIP traffic uses every endpoint: {cluster:?}");
    }

    #[test]
    fn a_service_without_endpoints_lands_in_the_reject_map_only() {
        let s = spec(&svc("empty", "10.96.0.13", "", &[]));
        let text = nft_ruleset(&s).unwrap();
        assert!(text.contains(
            "add element ip kube-proxy no-endpoint-services { 10.96.0.13 . tcp . 80 comment \"ns/empty:http\" : goto reject-chain }"
        ));
        assert!(!text.contains("service-ips { 10.96.0.13"), "no dispatch to a service without endpoints");
        assert!(
            !text.lines().any(|l| l.starts_with("add chain ip kube-proxy service-") && l.contains('/')),
            "no service chain"
        );
        assert!(!text.contains("dnat to"));
    }

    #[test]
    fn one_endpoint_change_rewrites_only_that_service() {
        let other = svc("other", "10.96.0.20", "", &[("10.244.1.1", true, "n2")]);
        let a = spec(&format!(
            "{}{other}",
            svc("web", "10.96.0.10", "", &[("10.244.0.1", true, "n2"), ("10.244.0.2", true, "n3")])
        ));
        let b = spec(&format!(
            "{}{other}",
            svc("web", "10.96.0.10", "", &[("10.244.0.1", true, "n2"), ("10.244.0.9", true, "n3")])
        ));
        let u = nft_service_update(&a, &b, "ns/web").unwrap();
        let t = &u.transaction;
        assert!(!t.contains("ns/other") && !t.contains("other/"), "{t}");
        assert!(t.contains("__10.244.0.9/8080") && t.contains("dnat to 10.244.0.9:8080"), "{t}");
        assert!(!t.contains("dnat to 10.244.0.2:8080"), "{t}");
        let stale: Vec<&str> =
            t.lines().filter(|l| l.starts_with("flush chain") && l.contains("__10.244.0.2/8080")).collect();
        assert_eq!(stale.len(), 1, "{t}");
        assert!(
            u.deferred.starts_with("delete chain ip kube-proxy endpoint-") && u.deferred.contains("__10.244.0.2/8080")
        );
        assert_eq!(u.element_ops, 0, "the service-ips element still points at the same service chain");
        assert_eq!(u.chains_written, 3, "two endpoint chains and the service chain");
        // Removing the last endpoint moves the cluster IP to the reject map.
        let c = spec(&format!("{}{other}", svc("web", "10.96.0.10", "", &[])));
        let u = nft_service_update(&b, &c, "ns/web").unwrap();
        assert!(
            u.transaction.contains("delete element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 }"),
            "{}",
            u.transaction
        );
        assert!(
            u.transaction.contains("add element ip kube-proxy no-endpoint-services { 10.96.0.10 . tcp . 80 comment")
        );
        assert_eq!(u.element_ops, 2);
    }
}
