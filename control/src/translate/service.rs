//! One Service's translation: its ports, families and frontends into pending specs, and the
//! endpoints of its EndpointSlices into backends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use dataplane::addr::Cidr;
use dataplane::tables::{BackendSpec, Conditions, Frontend, FrontendKind, ServiceSpec};
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::fields::{
    PortInfo, conditions_of, parse_cidr_lenient, parse_ip, parse_policy, parse_proto, parse_sourced, port_u16,
};
use super::select::{Ep, Policy, Selection};
use super::{
    AFFINITY_DEFAULT_TIMEOUT_S, AFFINITY_MAX_TIMEOUT_S, ANNOTATION_FORWARDING_MODE, ANNOTATION_SCHEDULER,
    ANNOTATION_SOURCE_RANGES, Family, Issue, NodeInfo, Severity, TranslateReport, proxied, select,
};
use crate::config::Config;

pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a Config,
    pub(super) node: &'a NodeInfo,
    pub(super) node_port_addrs: &'a [IpAddr],
}

/// A Service's spec before the cross-Service checks (table names, frontend collisions), shared
/// with every build that reuses it; `fields[i]` names the Service field that
/// `spec.frontends[i]` comes from, for error messages.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) spec: Arc<ServiceSpec>,
    pub(super) fields: Vec<String>,
}

pub(super) fn svc_err(label: &str, field: impl Into<String>, message: impl Into<String>) -> Issue {
    Issue {
        severity: Severity::Error,
        object: label.to_owned(),
        field: field.into(),
        message: format!("{}; Service not programmed", message.into()),
    }
}

/// Translates one Service into pending specs. `Err` = the whole Service is skipped.
pub(super) fn translate_service(
    svc: &Service,
    slices: &[&EndpointSlice],
    ctx: &Ctx<'_>,
    label: &str,
    report: &mut TranslateReport,
) -> Result<Vec<Pending>, Issue> {
    let meta = &svc.metadata;
    if !proxied(meta) {
        return Ok(Vec::new());
    }
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let name = meta.name.as_deref().unwrap_or_default();
    let Some(spec) = svc.spec.as_ref() else {
        return Err(svc_err(label, "spec", "missing"));
    };
    let no_annotations = BTreeMap::new();
    let annotations = meta.annotations.as_ref().unwrap_or(&no_annotations);

    // Service type (SVC-01, SVC-02, SVC-05, SVC-06, SVC-12).
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    match ty {
        "ExternalName" => return Ok(Vec::new()), // SVC-12, ROLE-01: nothing is proxied.
        "ClusterIP" | "NodePort" | "LoadBalancer" => {}
        other => {
            return Err(svc_err(
                label,
                "spec.type",
                format!("unknown type {other:?} (expected ClusterIP, NodePort, LoadBalancer or ExternalName)"),
            ));
        }
    }

    // Cluster IPs (DS-01, SVC-13).
    let (ip_strings, ip_field): (Vec<String>, &str) = match spec.cluster_ips.as_ref() {
        Some(v) if !v.is_empty() => (v.clone(), "spec.clusterIPs"),
        _ => (spec.cluster_ip.iter().cloned().collect(), "spec.clusterIP"),
    };
    let Some(first) = ip_strings.first() else {
        return Err(svc_err(label, "spec.clusterIP", "missing (only ExternalName Services have none)"));
    };
    if first == "None" {
        return Ok(Vec::new()); // SVC-13: headless.
    }
    let mut cluster_ips: Vec<(IpAddr, String)> = Vec::new();
    for (i, s) in ip_strings.iter().enumerate() {
        let field = if ip_field == "spec.clusterIP" { ip_field.to_owned() } else { format!("{ip_field}[{i}]") };
        let Some(a) = parse_ip(s) else {
            return Err(svc_err(label, field, format!("{s:?} is not an IP address")));
        };
        if cluster_ips.iter().any(|(x, _)| Family::of(*x) == Family::of(a)) {
            return Err(svc_err(
                label,
                field,
                format!("a second {} cluster IP (at most one per family)", Family::of(a).name()),
            ));
        }
        cluster_ips.push((a, field));
    }
    let families: Vec<Family> = cluster_ips.iter().map(|(a, _)| Family::of(*a)).collect();

    // Ports (PORT-01..05).
    let raw_ports: &[ServicePort] = spec.ports.as_deref().unwrap_or_default();
    if raw_ports.is_empty() {
        return Ok(Vec::new());
    }
    let mut ports = Vec::with_capacity(raw_ports.len());
    let mut seen_names = BTreeMap::new();
    let mut seen_keys = BTreeMap::new();
    for (i, p) in raw_ports.iter().enumerate() {
        let f = |s: &str| format!("spec.ports[{i}].{s}");
        let proto = parse_proto(p.protocol.as_deref()).ok_or_else(|| {
            svc_err(
                label,
                f("protocol"),
                format!("{:?} is not TCP, UDP or SCTP", p.protocol.as_deref().unwrap_or_default()),
            )
        })?;
        let port =
            port_u16(p.port).ok_or_else(|| svc_err(label, f("port"), format!("{} is not in 1..=65535", p.port)))?;
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(n) => {
                Some(port_u16(n).ok_or_else(|| svc_err(label, f("nodePort"), format!("{n} is not in 1..=65535")))?)
            }
        };
        let pname = p.name.clone().unwrap_or_default();
        if raw_ports.len() > 1 && pname.is_empty() {
            return Err(svc_err(
                label,
                f("name"),
                "missing: every port of a multi-port Service must be named (PORT-02)",
            ));
        }
        if let Some(j) = seen_names.insert(pname.clone(), i).filter(|_| !pname.is_empty()) {
            return Err(svc_err(label, f("name"), format!("{pname:?} is also the name of spec.ports[{j}]")));
        }
        if let Some(j) = seen_keys.insert((port, proto), i) {
            return Err(svc_err(label, f("port"), format!("{}/{port} is also spec.ports[{j}]", proto.as_str())));
        }
        let target_number = match &p.target_port {
            None => Some(port), // PORT-05
            Some(IntOrString::Int(n)) => {
                Some(port_u16(*n).ok_or_else(|| svc_err(label, f("targetPort"), format!("{n} is not in 1..=65535")))?)
            }
            Some(IntOrString::String(s)) if s.is_empty() => {
                return Err(svc_err(label, f("targetPort"), "empty name"));
            }
            Some(IntOrString::String(_)) => None,
        };
        let table_name = if pname.is_empty() { port.to_string() } else { pname.clone() };
        ports.push(PortInfo { name: pname, proto, port, node_port, target_number, table_name });
    }

    // Traffic policies (TP-01..03).
    let policy = |field: &str, v: Option<&str>| {
        parse_policy(v)
            .ok_or_else(|| svc_err(label, field, format!("{:?} is not Cluster or Local", v.unwrap_or_default())))
    };
    let etp = policy("spec.externalTrafficPolicy", spec.external_traffic_policy.as_deref())?;
    let itp = policy("spec.internalTrafficPolicy", spec.internal_traffic_policy.as_deref())?;

    // Session affinity (AFF-01..03).
    let affinity = match spec.session_affinity.as_deref().unwrap_or("None") {
        "None" | "" => None,
        "ClientIP" => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match t {
                None => Some(AFFINITY_DEFAULT_TIMEOUT_S),
                Some(t) => Some(
                    u32::try_from(t).ok().filter(|t| (1..=AFFINITY_MAX_TIMEOUT_S).contains(t)).ok_or_else(|| {
                        svc_err(
                            label,
                            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                            format!("{t} is not in 1..={AFFINITY_MAX_TIMEOUT_S} seconds"),
                        )
                    })?,
                ),
            }
        }
        other => {
            return Err(svc_err(label, "spec.sessionAffinity", format!("{other:?} is not None or ClientIP")));
        }
    };

    // Scheduler and forwarding mode (config default, per-Service annotation).
    let scheduler = match annotations.get(ANNOTATION_SCHEDULER) {
        None => ctx.cfg.ipvs.scheduler,
        Some(v) => crate::config::parse_scheduler(v)
            .map_err(|m| svc_err(label, format!("metadata.annotations[{ANNOTATION_SCHEDULER}]"), m))?,
    };
    let mode = match annotations.get(ANNOTATION_FORWARDING_MODE) {
        None => ctx.cfg.forwarding_mode,
        Some(v) => crate::config::parse_forwarding_mode(v)
            .map_err(|m| svc_err(label, format!("metadata.annotations[{ANNOTATION_FORWARDING_MODE}]"), m))?,
    };

    // Topology: the EndpointSlices' hints alone decide (select.rs); `trafficDistribution`
    // and the topology-mode annotations only tell the controller that writes them (TOPO-06).

    // External addresses: externalIPs (SVC-11), LB ingress (SVC-06, SVC-08, LB-01).
    let mut external_ips = Vec::new();
    for (i, s) in spec.external_ips.iter().flatten().enumerate() {
        let field = format!("spec.externalIPs[{i}]");
        external_ips.extend(parse_sourced(s, field, "external IP", label, report));
    }
    let mut lb_ips = Vec::new();
    let mut source_ranges = Vec::new();
    if ty == "LoadBalancer" {
        // Whatever `spec.loadBalancerClass` says: the class selects the controller that
        // provisions and announces the address, while every proxy forwards to it, as
        // kube-proxy does (pkg/proxy/serviceport.go reads the ingress IPs without looking at
        // the class).
        let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
        for (i, ing) in ingress.into_iter().flatten().enumerate() {
            // ipMode Proxy: the LB itself proxies, the node never sees the ingress IP as
            // destination (kube-proxy skips it too).
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            let Some(s) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
                continue; // hostname-only ingress (SVC-06): nothing to match on.
            };
            let field = format!("status.loadBalancer.ingress[{i}].ip");
            lb_ips.extend(parse_sourced(s, field, "ingress IP", label, report));
        }
        // LB-01: source ranges (field, else the legacy annotation).
        let (ranges, field_of): (Vec<String>, Box<dyn Fn(usize) -> String>) =
            match spec.load_balancer_source_ranges.as_ref().filter(|v| !v.is_empty()) {
                Some(v) => (v.clone(), Box::new(|i| format!("spec.loadBalancerSourceRanges[{i}]"))),
                None => (
                    annotations
                        .get(ANNOTATION_SOURCE_RANGES)
                        .map(|a| a.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
                        .unwrap_or_default(),
                    Box::new(|_| format!("metadata.annotations[{ANNOTATION_SOURCE_RANGES}]")),
                ),
            };
        for (i, r) in ranges.iter().enumerate() {
            match parse_cidr_lenient(r) {
                Some(c) => source_ranges.push(c),
                None => {
                    report.issues.push(Issue {
                        severity: Severity::Error,
                        object: label.to_owned(),
                        field: field_of(i),
                        message: format!(
                            "{r:?} is not a CIDR; the LoadBalancer ingress IPs are not programmed (fail closed)"
                        ),
                    });
                    lb_ips.clear();
                }
            }
        }
    }
    let node_port_service = matches!(ty, "NodePort" | "LoadBalancer");

    // Family filtering of external addresses (DS-03, DS-05).
    for a in external_ips.iter().chain(&lb_ips) {
        if !families.contains(&Family::of(a.addr)) {
            report.issues.push(Issue {
                severity: Severity::Warning,
                object: label.to_owned(),
                field: a.field.clone(),
                message: format!(
                    "{} is {} but the Service has no {} cluster IP; ignored (as kube-proxy does)",
                    a.addr,
                    Family::of(a.addr).name(),
                    Family::of(a.addr).name()
                ),
            });
        }
    }

    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let here = select::Here { node: ctx.node.name.as_deref(), zone: ctx.node.zone.as_deref() };
    let masq_all = ctx.cfg.iptables.masquerade_all;
    let mut out = Vec::new();
    for (pi, p) in ports.iter().enumerate() {
        for (fi, &(cluster_ip, ref cip_field)) in cluster_ips.iter().enumerate() {
            let fam = Family::of(cluster_ip);
            let eps = gather_endpoints(slices, p, fam, publish_not_ready, ctx.node.name.as_deref(), report);
            let mut base = format!("{ns}/{name}:{}", p.table_name);
            if fi > 0 {
                base.push('/');
                base.push_str(fam.lower());
            }
            let fe = |addr: IpAddr, port: u16, kind: FrontendKind, masquerade: bool, ranges: &[Cidr]| Frontend {
                addr,
                proto: p.proto,
                port,
                kind,
                masquerade,
                source_ranges: ranges.to_vec(),
            };
            // NAT-01 (ClusterIP: DNAT only) unless masqueradeAll (NAT-04).
            let internal_fe = vec![(fe(cluster_ip, p.port, FrontendKind::ClusterIp, masq_all, &[]), cip_field.clone())];
            // NAT-02: external traffic is masqueraded under eTP Cluster; TP-04: Local keeps
            // the client IP.
            let ext_masq = masq_all || etp == Policy::Cluster;
            let mut external_fe = Vec::new();
            if node_port_service && let Some(np) = p.node_port {
                for a in ctx.node_port_addrs.iter().filter(|a| Family::of(**a) == fam) {
                    external_fe.push((
                        fe(*a, np, FrontendKind::NodePort, ext_masq, &[]),
                        format!("spec.ports[{pi}].nodePort"),
                    ));
                }
            }
            for a in external_ips.iter().filter(|a| Family::of(a.addr) == fam) {
                external_fe.push((fe(a.addr, p.port, FrontendKind::ExternalIp, ext_masq, &[]), a.field.clone()));
            }
            for a in lb_ips.iter().filter(|a| Family::of(a.addr) == fam) {
                external_fe
                    .push((fe(a.addr, p.port, FrontendKind::LoadBalancer, ext_masq, &source_ranges), a.field.clone()));
            }

            let int_sel = select::select(&eps, itp, here);
            if int_sel.no_local_endpoints {
                report.no_local_endpoints.internal += 1;
            }
            let backends_for = |sel: &Selection| -> Vec<BackendSpec> {
                eps.iter()
                    .zip(&sel.eligible)
                    .map(|(e, &eligible)| BackendSpec {
                        addr: e.addr,
                        port: e.port,
                        weight: u16::from(eligible),
                        eligible,
                        conditions: Conditions { ready: e.ready, serving: e.serving, terminating: e.terminating },
                        node_local: e.local,
                    })
                    .collect()
            };
            let pending = |name: String, frontends: Vec<(Frontend, String)>, sel: &Selection| {
                let (frontends, fields) = frontends.into_iter().unzip();
                Pending {
                    spec: Arc::new(ServiceSpec {
                        name,
                        frontends,
                        scheduler,
                        affinity_timeout_s: affinity,
                        mode,
                        when_empty: sel.when_empty,
                        backends: backends_for(sel),
                    }),
                    fields,
                }
            };
            if external_fe.is_empty() {
                out.push(pending(base, internal_fe, &int_sel));
                continue;
            }
            let ext_sel = select::select(&eps, etp, here);
            if ext_sel.no_local_endpoints {
                report.no_local_endpoints.external += 1;
            }
            if ext_sel.eligible == int_sel.eligible && ext_sel.when_empty == int_sel.when_empty {
                let mut all = internal_fe;
                all.extend(external_fe);
                out.push(pending(base, all, &int_sel));
            } else {
                out.push(pending(base.clone(), internal_fe, &int_sel));
                out.push(pending(format!("{base}/external"), external_fe, &ext_sel));
            }
        }
    }
    Ok(out)
}

/// Collects the endpoints of one Service port and family from the Service's slices.
pub(super) fn gather_endpoints(
    slices: &[&EndpointSlice],
    p: &PortInfo,
    fam: Family,
    publish_not_ready: bool,
    node_name: Option<&str>,
    report: &mut TranslateReport,
) -> Vec<Ep> {
    let mut by_addr: BTreeMap<IpAddr, Ep> = BTreeMap::new();
    for slice in slices {
        // EPS-03: FQDN slices cannot be programmed; each family has its own slices (DS-03).
        // Slices labelled for another proxy or headless are not kube-proxy's either.
        if slice.address_type != fam.name() || !proxied(&slice.metadata) {
            continue;
        }
        // Made only for an issue (most slices have none).
        let label = || {
            format!(
                "EndpointSlice {}/{}",
                slice.metadata.namespace.as_deref().unwrap_or("default"),
                slice.metadata.name.as_deref().unwrap_or_default()
            )
        };
        // PORT-04 / EPS-04: the slice port whose name (and protocol) matches the Service port.
        let Some((si, sp)) = slice.ports.iter().flatten().enumerate().find(|(_, sp)| {
            sp.name.as_deref().unwrap_or("") == p.name && parse_proto(sp.protocol.as_deref()) == Some(p.proto)
        }) else {
            continue;
        };
        let port = match sp.port {
            Some(n) => match port_u16(n) {
                Some(n) => n,
                None => {
                    report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label(),
                        field: format!("ports[{si}].port"),
                        message: format!("{n} is not in 1..=65535; this slice's endpoints are ignored"),
                    });
                    continue;
                }
            },
            // PORT-05: no number in the slice -> a numeric targetPort (default: port).
            None => match p.target_number {
                Some(n) => n,
                None => {
                    report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label(),
                        field: format!("ports[{si}].port"),
                        message: "missing and the Service's targetPort is a name; this slice's endpoints are ignored"
                            .into(),
                    });
                    continue;
                }
            },
        };
        for (ei, e) in slice.endpoints.iter().enumerate() {
            // EPS-11: the first address only.
            let Some(a0) = e.addresses.first() else { continue };
            let addr = match parse_ip(a0) {
                Some(a) if Family::of(a) == fam => a,
                Some(a) => {
                    report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label(),
                        field: format!("endpoints[{ei}].addresses[0]"),
                        message: format!("{a} is not {} like the slice's addressType; ignored", fam.name()),
                    });
                    continue;
                }
                None => {
                    report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label(),
                        field: format!("endpoints[{ei}].addresses[0]"),
                        message: format!("{a0:?} is not an IP address; ignored"),
                    });
                    continue;
                }
            };
            let Conditions { ready, serving, terminating } = conditions_of(e, publish_not_ready);
            let local = node_name.is_some() && e.node_name.as_deref() == node_name; // TP-05
            let hint_set = |v: Option<Vec<String>>| -> Option<BTreeSet<String>> {
                v.map(|v| v.into_iter().collect::<BTreeSet<_>>()).filter(|s| !s.is_empty())
            };
            let hints = e.hints.as_ref();
            let ep = Ep {
                addr,
                port,
                ready,
                serving,
                terminating,
                local,
                zone_hints: hint_set(
                    hints.and_then(|h| h.for_zones.as_ref()).map(|z| z.iter().map(|z| z.name.clone()).collect()),
                ),
                node_hints: hint_set(
                    hints.and_then(|h| h.for_nodes.as_ref()).map(|n| n.iter().map(|n| n.name.clone()).collect()),
                ),
            };
            // EPS-09: deduplicate by address; first wins unless the newcomer is local.
            match by_addr.get(&addr) {
                Some(old) if old.local || !ep.local => {}
                _ => {
                    by_addr.insert(addr, ep);
                }
            }
        }
    }
    by_addr.into_values().collect()
}
