//! The ruleset kube-proxy's iptables mode programs, in `iptables-restore` format (`*filter`
//! then `*nat`, as its `syncProxyRules` writes `iptablesData`).
//!
//! Follows `pkg/proxy/iptables/proxier.go` (kubernetes/kubernetes):
//! - the jumps of `iptablesJumpChains` from the built-in chains (kube-proxy installs them with
//!   `EnsureRule` outside the restore; here they are part of the file so that it is complete
//!   in an empty namespace);
//! - `*filter`: `KUBE-SERVICES` (REJECT for ClusterIPs of services without endpoints),
//!   `KUBE-EXTERNAL-SERVICES` (REJECT/DROP for external destinations without endpoints),
//!   `KUBE-FORWARD`, `KUBE-NODEPORTS`, `KUBE-PROXY-FIREWALL` (loadBalancerSourceRanges);
//! - `*nat`: `KUBE-SERVICES`, `KUBE-NODEPORTS` (the NodePort jump is the last rule of
//!   `KUBE-SERVICES`), `KUBE-POSTROUTING` (`MASQUERADE --random-fully` of packets marked
//!   0x4000), `KUBE-MARK-MASQ`, per service port `KUBE-SVC-` (Cluster policy), `KUBE-SVL-`
//!   (Local policy), `KUBE-EXT-`, `KUBE-FW-`, and per endpoint `KUBE-SEP-` chains;
//!   `writeServiceToEndpointRules` spreads new flows with
//!   `-m statistic --mode random --probability 1/(n-i)`.
//!
//! Same omissions as [`crate::nft`]: no local-traffic detector, no health-check node ports,
//! DSR services programmed as NAT.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use dataplane::tables::TablesSpec;

use crate::model::{ModelError, ServicePort, service_ports};
use crate::names;

/// kube-proxy's masquerade mark (bit 14), as its iptables rules print it.
pub const MASQUERADE_MARK: &str = "0x4000";

/// Above this many endpoints kube-proxy drops the comments of `KUBE-SEP-` rules
/// (`largeClusterEndpointsThreshold`).
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

/// `computeProbability` in kube-proxy: `fmt.Sprintf("%0.10f", 1.0/float64(n))`.
pub fn probability(n: usize) -> String {
    #[allow(clippy::cast_precision_loss, reason = "n is an endpoint count, far below 2^52")]
    let p = 1.0 / n as f64;
    format!("{p:0.10}")
}

fn endpoint_str(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// The names of a service port's chains (`servicePortPolicyClusterChain`,
/// `servicePortPolicyLocalChainName`, `serviceExternalChainName`, `serviceFirewallChainName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortChains {
    /// `KUBE-SVC-…`.
    pub cluster: String,
    /// `KUBE-SVL-…`.
    pub local: String,
    /// `KUBE-EXT-…`.
    pub external: String,
    /// `KUBE-FW-…`.
    pub firewall: String,
}

impl PortChains {
    /// Chain names of `sp`.
    pub fn of(sp: &ServicePort) -> Self {
        let h = names::iptables_port_proto_hash(&sp.name.service_port_name(), sp.protocol());
        Self {
            cluster: format!("KUBE-SVC-{h}"),
            local: format!("KUBE-SVL-{h}"),
            external: format!("KUBE-EXT-{h}"),
            firewall: format!("KUBE-FW-{h}"),
        }
    }
}

/// Which address family's ruleset to write (`iptables-restore` or `ip6tables-restore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4, for `iptables-restore`.
    V4,
    /// IPv6, for `ip6tables-restore`.
    V6,
}

/// The `iptables-restore` input kube-proxy's iptables mode writes for the services of `spec`
/// of one address family.
///
/// # Errors
/// [`ModelError`] for spec names `build_spec` never produces.
pub fn iptables_ruleset(spec: &TablesSpec, family: Family) -> Result<String, ModelError> {
    let ipv6 = family == Family::V6;
    let ports: Vec<ServicePort> = service_ports(spec, None)?.into_iter().filter(|p| p.ipv6 == ipv6).collect();
    let total_endpoints: usize = ports.iter().map(|p| p.all_endpoints().len()).sum();
    let large = total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
    let mark = MASQUERADE_MARK;

    let mut f_chains = String::new();
    let mut f_rules = String::new();
    let mut n_chains = String::new();
    let mut n_rules = String::new();
    for c in ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL"] {
        let _ = writeln!(f_chains, ":{c} - [0:0]");
    }
    for c in ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"] {
        let _ = writeln!(n_chains, ":{c} - [0:0]");
    }
    // iptablesJumpChains.
    let _ = writeln!(
        f_rules,
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
    );
    let _ =
        writeln!(f_rules, "-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS");
    let _ = writeln!(
        f_rules,
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"
    );
    let _ = writeln!(
        f_rules,
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
    );
    let _ = writeln!(f_rules, "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD");
    let _ = writeln!(
        f_rules,
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    );
    let _ = writeln!(
        f_rules,
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"
    );
    let _ = writeln!(
        f_rules,
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
    );
    let _ = writeln!(
        f_rules,
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    );
    let _ = writeln!(n_rules, "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES");
    let _ = writeln!(n_rules, "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES");
    let _ =
        writeln!(n_rules, "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING");
    // KUBE-POSTROUTING and KUBE-MARK-MASQ.
    let _ = writeln!(n_rules, "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN");
    let _ = writeln!(n_rules, "-A KUBE-POSTROUTING -j MARK --xor-mark {mark}");
    let _ = writeln!(
        n_rules,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
    let _ = writeln!(n_rules, "-A KUBE-MARK-MASQ -j MARK --or-mark {mark}");

    let mut node_port_ips: BTreeSet<IpAddr> = BTreeSet::new();
    for sp in &ports {
        node_port_ips.extend(sp.node_port_addrs.iter().copied());
        let proto = sp.protocol();
        let spn = sp.name.service_port_name();
        let ch = PortChains::of(sp);
        let has_endpoints = sp.has_endpoints();
        let has_internal = !sp.internal.endpoints.is_empty();
        let has_external = !sp.external.endpoints.is_empty();
        let cluster_eps = sp.cluster_endpoints().filter(|e| !e.is_empty());
        let local_eps = sp.local_endpoints().filter(|e| !e.is_empty());
        let internal_chain = if sp.internal_local { &ch.local } else { &ch.cluster };
        let external_policy_chain = if sp.external_local { &ch.local } else { &ch.cluster };
        let uses_external = has_endpoints && sp.externally_accessible();
        let uses_fw = has_endpoints && !sp.lb_ips.is_empty() && !sp.source_ranges.is_empty();
        let lb_chain = if uses_fw { &ch.firewall } else { &ch.external };
        let (int_target, int_comment, ext_target, ext_comment) = if has_endpoints {
            let c = format!("\"{spn} has no local endpoints\"");
            ("DROP", c.clone(), "DROP", c)
        } else {
            let c = format!("\"{spn} has no endpoints\"");
            ("REJECT", c.clone(), "REJECT", c)
        };

        if let Some((cip, port)) = sp.cluster_ip {
            if has_internal {
                let _ = writeln!(
                    n_rules,
                    "-A KUBE-SERVICES -m comment --comment \"{spn} cluster IP\" -m {proto} -p {proto} -d {} --dport {port} -j {internal_chain}",
                    host(cip)
                );
            } else {
                let _ = writeln!(
                    f_rules,
                    "-A KUBE-SERVICES -m comment --comment {int_comment} -m {proto} -p {proto} -d {} --dport {port} -j {int_target}",
                    host(cip)
                );
            }
        }
        for (ip, port) in &sp.external_ips {
            if has_endpoints {
                let _ = writeln!(
                    n_rules,
                    "-A KUBE-SERVICES -m comment --comment \"{spn} external IP\" -m {proto} -p {proto} -d {} --dport {port} -j {}",
                    host(*ip),
                    ch.external
                );
            }
            if !has_external {
                let _ = writeln!(
                    f_rules,
                    "-A KUBE-EXTERNAL-SERVICES -m comment --comment {ext_comment} -m {proto} -p {proto} -d {} --dport {port} -j {ext_target}",
                    host(*ip)
                );
            }
        }
        for (ip, port) in &sp.lb_ips {
            if has_endpoints {
                let _ = writeln!(
                    n_rules,
                    "-A KUBE-SERVICES -m comment --comment \"{spn} loadbalancer IP\" -m {proto} -p {proto} -d {} --dport {port} -j {lb_chain}",
                    host(*ip)
                );
            }
            if uses_fw {
                let _ = writeln!(
                    f_rules,
                    "-A KUBE-PROXY-FIREWALL -m comment --comment \"{spn} traffic not accepted by {}\" -m {proto} -p {proto} -d {} --dport {port} -j DROP",
                    ch.firewall,
                    host(*ip)
                );
            }
            if !has_external {
                let _ = writeln!(
                    f_rules,
                    "-A KUBE-EXTERNAL-SERVICES -m comment --comment {ext_comment} -m {proto} -p {proto} -d {} --dport {port} -j {ext_target}",
                    host(*ip)
                );
            }
        }
        if let Some(np) = sp.node_port {
            if has_endpoints {
                let _ = writeln!(
                    n_rules,
                    "-A KUBE-NODEPORTS -m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {}",
                    ch.external
                );
            }
            if !has_external {
                let _ = writeln!(
                    f_rules,
                    "-A KUBE-EXTERNAL-SERVICES -m comment --comment {ext_comment} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {ext_target}"
                );
            }
        }

        // Internal traffic: masqueradeAll.
        if has_internal
            && sp.internal.masquerade
            && let Some((cip, port)) = sp.cluster_ip
        {
            let _ = writeln!(
                n_rules,
                "-A {internal_chain} -m comment --comment \"{spn} cluster IP\" -m {proto} -p {proto} -d {} --dport {port} -j KUBE-MARK-MASQ",
                host(cip)
            );
        }
        if uses_external {
            let _ = writeln!(n_chains, ":{} - [0:0]", ch.external);
            if !sp.external_local {
                let _ = writeln!(
                    n_rules,
                    "-A {} -m comment --comment \"masquerade traffic for {spn} external destinations\" -j KUBE-MARK-MASQ",
                    ch.external
                );
            } else {
                let _ = writeln!(
                    n_rules,
                    "-A {} -m comment --comment \"masquerade LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                    ch.external
                );
                if cluster_eps.is_some() {
                    let _ = writeln!(
                        n_rules,
                        "-A {} -m comment --comment \"route LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j {}",
                        ch.external, ch.cluster
                    );
                }
            }
            if has_external {
                let _ = writeln!(n_rules, "-A {} -j {external_policy_chain}", ch.external);
            }
        }
        if uses_fw {
            let _ = writeln!(n_chains, ":{} - [0:0]", ch.firewall);
            for r in &sp.source_ranges {
                let _ = writeln!(
                    n_rules,
                    "-A {} -m comment --comment \"{spn} loadbalancer IP\" -s {r} -j {}",
                    ch.firewall, ch.external
                );
            }
            let _ = writeln!(
                n_rules,
                "-A {} -m comment --comment \"other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL\"",
                ch.firewall
            );
        }
        let sep = |ep: (IpAddr, u16)| names::iptables_sep_chain(&spn, proto, &endpoint_str(ep.0, ep.1));
        for (chain, eps) in [(&ch.cluster, cluster_eps), (&ch.local, local_eps)] {
            let Some(eps) = eps else { continue };
            let _ = writeln!(n_chains, ":{chain} - [0:0]");
            // writeServiceToEndpointRules.
            if let Some(t) = sp.affinity_timeout_s {
                for ep in eps {
                    let s = sep(*ep);
                    let _ = writeln!(
                        n_rules,
                        "-A {chain} -m comment --comment {spn} -m recent --name {s} --rcheck --seconds {t} --reap -j {s}"
                    );
                }
            }
            let n = eps.len();
            for (i, ep) in eps.iter().enumerate() {
                let comment = format!("\"{spn} -> {}\"", endpoint_str(ep.0, ep.1));
                if i + 1 < n {
                    let _ = writeln!(
                        n_rules,
                        "-A {chain} -m comment --comment {comment} -m statistic --mode random --probability {} -j {}",
                        probability(n - i),
                        sep(*ep)
                    );
                } else {
                    let _ = writeln!(n_rules, "-A {chain} -m comment --comment {comment} -j {}", sep(*ep));
                }
            }
        }
        for ep in sp.all_endpoints() {
            let s = sep(ep);
            let _ = writeln!(n_chains, ":{s} - [0:0]");
            let comment = if large { String::new() } else { format!(" -m comment --comment {spn}") };
            let _ = writeln!(n_rules, "-A {s}{comment} -s {} -j KUBE-MARK-MASQ", host(ep.0));
            let affinity =
                if sp.affinity_timeout_s.is_some() { format!(" -m recent --name {s} --set") } else { String::new() };
            let _ = writeln!(
                n_rules,
                "-A {s}{comment}{affinity} -m {proto} -p {proto} -j DNAT --to-destination {}",
                endpoint_str(ep.0, ep.1)
            );
        }
    }
    // The NodePort jump, last in KUBE-SERVICES.
    let np_comment = "\"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
    if node_port_ips.is_empty() {
        let lo = if ipv6 { "::1/128" } else { "127.0.0.0/8" };
        let _ = writeln!(
            n_rules,
            "-A KUBE-SERVICES -m comment --comment {np_comment} -m addrtype --dst-type LOCAL ! -d {lo} -j KUBE-NODEPORTS"
        );
    } else {
        for ip in &node_port_ips {
            let _ = writeln!(
                n_rules,
                "-A KUBE-SERVICES -m comment --comment {np_comment} -d {} -j KUBE-NODEPORTS",
                host(*ip)
            );
        }
    }
    let _ = writeln!(f_rules, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP");
    let _ = writeln!(
        f_rules,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    );
    let _ = writeln!(
        f_rules,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );

    let mut out = String::with_capacity(f_chains.len() + f_rules.len() + n_chains.len() + n_rules.len() + 64);
    out.push_str("*filter\n");
    out.push_str(&f_chains);
    out.push_str(&f_rules);
    out.push_str("COMMIT\n*nat\n");
    out.push_str(&n_chains);
    out.push_str(&n_rules);
    out.push_str("COMMIT\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::tests::{spec, svc};

    #[test]
    fn statistic_probabilities_spread_over_the_eligible_endpoints() {
        let s = spec(&svc(
            "web",
            "10.96.0.10",
            "",
            &[
                ("10.244.0.1", true, "n2"),
                ("10.244.0.2", true, "n3"),
                ("10.244.0.3", true, "n4"),
                ("10.244.0.4", false, "n4"),
            ],
        ));
        let text = iptables_ruleset(&s, Family::V4).unwrap();
        let svc_rules: Vec<&str> = text.lines().filter(|l| l.starts_with("-A KUBE-SVC-")).collect();
        assert_eq!(svc_rules.len(), 3, "{svc_rules:?}");
        assert!(svc_rules[0].contains("--probability 0.3333333333 -j KUBE-SEP-"), "{}", svc_rules[0]);
        assert!(svc_rules[1].contains("--probability 0.5000000000 -j KUBE-SEP-"), "{}", svc_rules[1]);
        assert!(!svc_rules[2].contains("statistic"), "the last rule is a catch-all");
        let mut dnat: Vec<&str> =
            text.lines().filter_map(|l| l.split_once("-j DNAT --to-destination ").map(|(_, t)| t)).collect();
        dnat.sort_unstable();
        assert_eq!(dnat, ["10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080"]);
        assert!(text.contains("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"));
        assert!(text.contains("-A KUBE-SERVICES -m comment --comment \"ns/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.10/32 --dport 80 -j KUBE-SVC-"));
        assert!(text.starts_with("*filter\n") && text.contains("COMMIT\n*nat\n") && text.ends_with("COMMIT\n"));
    }

    #[test]
    fn nodeport_goes_through_kube_ext_with_masquerade_and_empty_services_are_rejected() {
        let s = spec(&format!(
            "{}{}",
            svc("np", "10.96.0.11", "  type: NodePort\n", &[("10.244.0.1", true, "n2")]),
            svc("empty", "10.96.0.12", "", &[])
        ));
        let text = iptables_ruleset(&s, Family::V4).unwrap();
        let ext = names::iptables_port_proto_hash("ns/np:http", "tcp");
        assert!(text.contains(&format!(
            "-A KUBE-NODEPORTS -m comment --comment ns/np:http -m tcp -p tcp --dport 30080 -j KUBE-EXT-{ext}"
        )));
        assert!(text.contains(&format!("-A KUBE-EXT-{ext} -m comment --comment \"masquerade traffic for ns/np:http external destinations\" -j KUBE-MARK-MASQ")));
        assert!(text.contains(&format!("-A KUBE-EXT-{ext} -j KUBE-SVC-{ext}")));
        let (filter, _) = text.split_once("*nat").unwrap();
        assert!(filter.contains("-A KUBE-SERVICES -m comment --comment \"ns/empty:http has no endpoints\" -m tcp -p tcp -d 10.96.0.12/32 --dport 80 -j REJECT"));
        assert!(!text.contains("ns/empty:http cluster IP"));
    }
}
