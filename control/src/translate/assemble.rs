//! The cross-Service half of a build: the Services' translations checked against each other
//! (table names, frontend collisions, Maglev sizes, SNAT addresses) and the tables' global
//! fields from the config and this node.

use std::net::IpAddr;
use std::sync::Arc;

use dataplane::tables::{
    ForwardingMode, Frontend, FrontendKind, L4Proto, NeighbourSpec, PortSpec, RouteSpec, Scheduler, ServiceSpec,
    TablesSpec,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{
    ANNOTATION_SCHEDULER, Cached, Ctx, Family, FastMap, FastSet, Issue, Made, NodeInfo, PLACEHOLDER_MTU, Pending,
    Severity, TranslateReport, TranslateStats, par_map, translate_service,
};
use crate::cluster::{ClusterState, LABEL_SERVICE_NAME, object_order};
use crate::config::Config;

/// A translation made by this build, with the objects it was made from (`None` for
/// unversioned objects, which are not cached).
type Fresh = (Option<Made>, Cached);

/// The body of [`Translator::build`](super::Translator::build) (and so of
/// [`build_spec`](super::build_spec)): every Service through `cache`, then the cross-Service
/// checks (table names, frontend collisions) and the global fields. Entries of Services that
/// no longer exist are dropped from `cache`.
pub(super) fn assemble(
    input: &ClusterState,
    cfg: &Config,
    cache: &mut FastMap<(String, String), (Made, Cached)>,
    threads: usize,
) -> (TablesSpec, TranslateReport, TranslateStats) {
    let mut report = TranslateReport::default();
    let mut stats = TranslateStats::default();
    let node = NodeInfo::new(input.node.as_ref(), &input.local_addresses, cfg, &mut report);
    let node_port_addrs = node.node_port_addresses(cfg);

    let mut slices: FastMap<(&str, &str), Vec<&Arc<EndpointSlice>>> = FastMap::default();
    for s in &input.endpoint_slices {
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(svc) = s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) {
            slices.entry((ns, svc.as_str())).or_default().push(s);
        }
    }
    for v in slices.values_mut() {
        v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }

    let mut services: Vec<&Arc<Service>> = input.services.iter().collect();
    // The Kubernetes source hands them over sorted already: check (n compares) before sorting.
    if !services.is_sorted_by(|a, b| object_order(&a.metadata) <= object_order(&b.metadata)) {
        services.sort_by(|a, b| object_order(&a.metadata).cmp(&object_order(&b.metadata)));
    }

    let ctx = Ctx { cfg, node: &node, node_port_addrs: &node_port_addrs };
    let label_of = |svc: &Service| {
        let (ns, name) = object_order(&svc.metadata);
        format!("Service {ns}/{name}")
    };
    // Pass 1: bring every Service's translation up to date (translating only those whose
    // objects changed, on several threads when there are many: `par_map`). Translations of
    // unversioned objects are not cached: kept aside.
    fn slices_for<'m>(
        slices: &'m FastMap<(&'m str, &'m str), Vec<&'m Arc<EndpointSlice>>>,
        svc: &'m Service,
    ) -> &'m [&'m Arc<EndpointSlice>] {
        slices.get(&object_order(&svc.metadata)).map_or(&[][..], Vec::as_slice)
    }
    // A cache that starts empty (`build_spec`'s) has nothing to look up or to drop: no key is
    // built for a lookup, and no set of the Services seen.
    let was_empty = cache.is_empty();
    let stale: Vec<&Arc<Service>> = services
        .iter()
        .copied()
        .filter(|svc| {
            was_empty || !cache.get(&cache_key(svc)).is_some_and(|(v, _)| v.matches(svc, slices_for(&slices, svc)))
        })
        .collect();
    // Each translation with its cache key and the objects it was made from (made on the
    // same threads: two strings and a few pointers per Service).
    let mut translated = par_map(stale.len(), threads, |i| {
        let svc = stale.get(i)?;
        let svc_slices = slices_for(&slices, svc);
        let objects: Vec<&EndpointSlice> = svc_slices.iter().map(|s| &***s).collect();
        let mut own = TranslateReport::default();
        let result = translate_service(svc, &objects, &ctx, &label_of(svc), &mut own);
        let cached = Cached { result, issues: own.issues, no_local: own.no_local_endpoints };
        Some((cache_key(svc), Made::of(svc, svc_slices), cached))
    })
    .into_iter()
    .zip(stale)
    .peekable();
    // Per Service: its cache key and its new translation (with the objects it was made from,
    // `None` for unversioned objects), or `None` when the cache's entry is up to date. New
    // translations go into the cache after pass 2, moved rather than copied.
    let mut order: Vec<((String, String), Option<Fresh>)> = Vec::with_capacity(services.len());
    for svc in &services {
        // `stale` is in Service order: its next entry is this Service if it was translated.
        let fresh = translated.next_if(|(_, s)| std::ptr::eq(*s, *svc)).and_then(|(c, _)| c);
        match fresh {
            Some((key, made, c)) => {
                stats.translated += 1;
                if made.is_none() && !was_empty {
                    cache.remove(&key);
                }
                order.push((key, Some((made, c))));
            }
            None => {
                stats.reused += 1;
                order.push((cache_key(svc), None));
            }
        }
    }
    if !was_empty {
        let seen: FastSet<(&str, &str)> = services.iter().map(|s| object_order(&s.metadata)).collect();
        cache.retain(|(ns, name), _| seen.contains(&(ns.as_str(), name.as_str())));
    }

    // Pass 2: the cross-Service checks, in Service order, reading the translations in place
    // (specs are shared with the cache; only one that loses a frontend is copied).
    let mut claimed: FastMap<(IpAddr, L4Proto, u16), &str> = FastMap::default();
    let mut names: FastSet<&str> = FastSet::default();
    let mut out = Vec::with_capacity(order.len());
    for ((key, new), svc) in order.iter().zip(&services) {
        let Some(c) = new.as_ref().map(|(_, c)| c).or_else(|| cache.get(key).map(|(_, c)| c)) else { continue };
        report.issues.extend(c.issues.iter().cloned());
        report.no_local_endpoints.internal += c.no_local.internal;
        report.no_local_endpoints.external += c.no_local.external;
        let pending = match &c.result {
            Ok(p) => p,
            Err(issue) => {
                report.issues.push(issue.clone());
                continue;
            }
        };
        for Pending { spec: p, fields } in pending {
            if !names.insert(p.name.as_str()) {
                report.issues.push(name_taken(label_of(svc), &p.name));
                continue;
            }
            // Frontends another Service claimed first are left out; the spec is shared as it is
            // when none is. Keyed as the dataplane keys them: an IPv4-mapped IPv6 address is
            // its IPv4 address.
            let mut kept = Vec::with_capacity(p.frontends.len());
            for (f, field) in p.frontends.iter().zip(fields) {
                let key = (f.addr.to_canonical(), f.proto, f.port);
                if let Some(owner) = claimed.get(&key) {
                    report.issues.push(frontend_taken(label_of(svc), field, f, owner));
                    continue;
                }
                claimed.insert(key, p.name.as_str());
                kept.push(f);
            }
            if kept.is_empty() {
                continue;
            }
            // The dataplane cannot build a Maglev table with more backends than slots; that
            // would fail the whole table build, so only this spec is left out.
            if let Some(issue) = maglev_overflow(p, cfg, || label_of(svc)) {
                report.issues.push(issue);
                continue;
            }
            if kept.len() == p.frontends.len() {
                out.push(Arc::clone(p));
            } else {
                let frontends = kept.into_iter().cloned().collect();
                out.push(Arc::new(ServiceSpec { frontends, ..ServiceSpec::clone(p) }));
            }
        }
    }

    drop((claimed, names));
    if was_empty {
        cache.reserve(order.len());
    }
    for (key, new) in order {
        if let Some((Some(made), c)) = new {
            cache.insert(key, (made, c));
        }
    }

    let spec = TablesSpec { services: out, ..globals(cfg, &node) };
    for (fam, have) in [(Family::V4, spec.snat_v4.is_some()), (Family::V6, spec.snat_v6.is_some())] {
        if !have && spec.services.iter().any(|s| needs_snat(s, fam, !spec.cluster_cidrs.is_empty())) {
            report.issues.push(snat_missing(fam));
        }
    }
    report.issues.sort();
    report.issues.dedup();
    (spec, report, stats)
}

/// A Service's key in the translator's cache: its [`object_order`] (namespace, name), owned.
fn cache_key(svc: &Service) -> (String, String) {
    let (ns, name) = object_order(&svc.metadata);
    (ns.to_owned(), name.to_owned())
}

/// The name-collision issue: a later spec named like an earlier one (table names are unique).
pub(super) fn name_taken(object: String, name: &str) -> Issue {
    Issue {
        severity: Severity::Error,
        object,
        field: "metadata.name".into(),
        message: format!("table name {name:?} is already used; not programmed"),
    }
}

/// The frontend-collision issue: `f` (from `field` of `object`) is a frontend of the earlier
/// spec `owner`.
pub(super) fn frontend_taken(object: String, field: &str, f: &Frontend, owner: &str) -> Issue {
    Issue {
        severity: Severity::Error,
        object,
        field: field.to_owned(),
        message: format!(
            "{} {} {}/{} is already a frontend of {owner}; not programmed here",
            f.kind.name(),
            f.addr,
            f.proto.as_str(),
            f.port
        ),
    }
}

/// The issue when a Maglev spec has more eligible backends than `maglevTableSize` slots (the
/// dataplane would refuse the whole table build, so only this spec is left out).
pub(super) fn maglev_overflow(p: &ServiceSpec, cfg: &Config, label: impl FnOnce() -> String) -> Option<Issue> {
    let weighted = p.backends.iter().filter(|b| b.eligible && b.weight > 0).count();
    let overflow = matches!(p.scheduler, Scheduler::Maglev { .. })
        && u32::try_from(weighted).map_or(true, |n| n > cfg.maglev_table_size);
    overflow.then(|| Issue {
        severity: Severity::Error,
        object: label(),
        field: format!("metadata.annotations[{ANNOTATION_SCHEDULER}]"),
        message: format!(
            "{weighted} eligible backends do not fit a Maglev table of maglevTableSize {}; {} not programmed (raise maglevTableSize)",
            cfg.maglev_table_size, p.name
        ),
    })
}

/// Whether spec `s` has a frontend of family `fam` whose flows are masqueraded (so a SNAT
/// address of that family is needed); `off_cluster`: the config has cluster CIDRs (NAT-06).
pub(super) fn needs_snat(s: &ServiceSpec, fam: Family, off_cluster: bool) -> bool {
    s.mode == ForwardingMode::Nat
        && s.frontends.iter().any(|f| {
            let off = f.kind == FrontendKind::ClusterIp && off_cluster;
            (f.masquerade || off) && Family::of(f.addr) == fam
        })
}

/// The warning when masqueraded frontends of `fam` exist and there is no SNAT address.
pub(super) fn snat_missing(fam: Family) -> Issue {
    Issue {
        severity: Severity::Warning,
        object: "XlbConfiguration".into(),
        field: format!("snatAddresses.{}", fam.lower()),
        message: format!(
            "masqueraded {} frontends exist but there is no SNAT address (none configured and no primary node address)",
            fam.name()
        ),
    }
}

/// Every field of the [`TablesSpec`] but `services`, from the config and this node.
pub(super) fn globals(cfg: &Config, node: &NodeInfo) -> TablesSpec {
    let (dsr_v4, dsr_v6) = cfg.dsr_source_prefixes_by_family();
    TablesSpec {
        services: Vec::new(),
        ports: cfg
            .interfaces
            .iter()
            .map(|i| PortSpec { name: i.name.clone(), mac: [0; 6], mtu: PLACEHOLDER_MTU })
            .collect(),
        neighbours: cfg
            .neighbours
            .iter()
            .filter_map(|n| Some(NeighbourSpec { addr: n.address, mac: n.mac, port: cfg.port_index(&n.port)? }))
            .collect(),
        routes: cfg.routes.iter().map(|r| RouteSpec { dst: r.dst, via: r.via }).collect(),
        // The kernel's routes are read by `xlb run` (they are not the cluster's objects).
        kernel_routes: Vec::new(),
        multipath_l4: false,
        snat_v4: cfg.snat_addresses.ipv4.map(IpAddr::V4).or_else(|| node.primary(Family::V4)),
        snat_v6: cfg.snat_addresses.ipv6.map(IpAddr::V6).or_else(|| node.primary(Family::V6)),
        dsr_source_v4: dsr_v4,
        dsr_source_v6: dsr_v6,
        maglev_max_size: cfg.maglev_table_size,
        maglev_min_size: cfg.maglev_min_table_size,
        // NAT-06: ClusterIP traffic from outside the pod CIDRs is masqueraded (kube-proxy's
        // `detectLocalMode: ClusterCIDR`); with masqueradeAll everything is anyway.
        cluster_cidrs: if cfg.iptables.masquerade_all { Vec::new() } else { cfg.cluster_cidr.clone() },
    }
}
