//! The allocator: which address each LoadBalancer Service of xlb's class gets.
//!
//! [`assign`] is a pure function of the pools, the Services and two settings. Its memory is
//! the Services' own `status.loadBalancer.ingress`: an address a Service already holds and
//! may still hold is kept, so a restart (or another xlb taking over the lease) gives the same
//! assignment. Three passes, each over the Services in the order (creationTimestamp,
//! namespace, name), so the older Service wins a conflict:
//! 1. **keep**: the Service's current ingress addresses are kept when they are one per family
//!    of its `spec.ipFamilies`, in one pool that still allows the Service, equal to what it
//!    asks for (if it asks), and not already kept by an older Service. Otherwise a Service
//!    that asks for nothing keeps, per family it has, the first address of that family its
//!    status lists that is free and in a pool that allows it (the pool of the first such
//!    address, and the one it names if it names one), so a Service that becomes dual-stack
//!    or single-stack keeps the address it holds; the families it then lacks get the lowest
//!    free addresses of that pool that no Service asks for, once every Service has kept what
//!    it may (if the pool has `autoAssign` or is named, and has room; if not, the Service
//!    goes on to pass 3 with nothing kept);
//! 2. **requested**: a Service that asks for addresses (annotation `xlb.dev/loadBalancerIPs`,
//!    MetalLB's `metallb.io/loadBalancerIPs` or `metallb.universe.tf/loadBalancerIPs`, or the
//!    deprecated `spec.loadBalancerIP`) gets exactly those, if they are in one pool it may use
//!    and free;
//! 3. **automatic**: the others get the lowest free address of each family from the first
//!    pool (see [`super::Pool`] for the order) that allows them, has `autoAssign`, holds every
//!    family they need, and has room; or from the pool their annotation `xlb.dev/address-pool`
//!    (or MetalLB's `metallb.io/address-pool`) names, `autoAssign` or not.
//!
//! A Service that is not xlb's (not type LoadBalancer, or of another class; [`is_ours`])
//! holds nothing: its addresses are free for others. A dual-stack Service gets both families
//! from the same pool or nothing (MetalLB does the same).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service, ServiceStatus};

use super::{Family, Pool, PoolSet};
use crate::config::Config;

/// xlb's annotation asking for addresses: comma-separated, at most one per family
/// (`192.0.2.10,2001:db8::10`).
pub const ANNOTATION_LOAD_BALANCER_IPS: &str = "xlb.dev/loadBalancerIPs";
/// MetalLB's annotation asking for addresses (MetalLB ≥ 0.14), read the same way.
pub const METALLB_LOAD_BALANCER_IPS: &str = "metallb.io/loadBalancerIPs";
/// MetalLB's older annotation asking for addresses, read the same way.
pub const METALLB_LOAD_BALANCER_IPS_OLD: &str = "metallb.universe.tf/loadBalancerIPs";
/// xlb's annotation naming the pool to take addresses from (even one without `autoAssign`).
pub const ANNOTATION_ADDRESS_POOL: &str = "xlb.dev/address-pool";
/// MetalLB's annotation naming the pool (MetalLB ≥ 0.14).
pub const METALLB_ADDRESS_POOL: &str = "metallb.io/address-pool";
/// MetalLB's older annotation naming the pool.
pub const METALLB_ADDRESS_POOL_OLD: &str = "metallb.universe.tf/address-pool";

/// Which LoadBalancer Services xlb assigns addresses to (SVC-08): config `loadBalancerClass`
/// and `handleDefaultLoadBalancerClass`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassFilter {
    /// Services whose `spec.loadBalancerClass` equals this are xlb's.
    pub class: Option<String>,
    /// Services with no `spec.loadBalancerClass` are xlb's too.
    pub handle_default: bool,
}

impl ClassFilter {
    /// The filter the config asks for.
    pub fn from_config(cfg: &Config) -> Self {
        Self { class: cfg.load_balancer_class.clone(), handle_default: cfg.handle_default_load_balancer_class }
    }
}

/// Whether xlb assigns `svc`'s addresses: `spec.type` is `LoadBalancer` and its
/// `spec.loadBalancerClass` is the filter's class, or unset while the filter handles the
/// default class.
pub fn is_ours(svc: &Service, filter: &ClassFilter) -> bool {
    let Some(spec) = svc.spec.as_ref() else { return false };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return false;
    }
    match spec.load_balancer_class.as_deref() {
        None => filter.handle_default,
        Some(c) => filter.class.as_deref() == Some(c),
    }
}

/// Settings of [`assign`] that differ between standalone and Kubernetes mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Standalone mode: an address the file gives explicitly (in `status.loadBalancer.ingress`,
    /// the annotation or `spec.loadBalancerIP`) need not be in a pool, since the file is the
    /// operator's own static assignment; it still must not be given to two Services. In
    /// Kubernetes mode (false), such an address is not kept and a request for it fails
    /// ([`AssignError::NotInPool`]), as with MetalLB.
    pub keep_addresses_outside_pools: bool,
}

/// A Service, by namespace (`default` when unset) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ServiceKey {
    /// The key of `svc`.
    pub fn of(svc: &Service) -> Self {
        let (ns, name) = crate::cluster::object_order(&svc.metadata);
        Self { namespace: ns.to_owned(), name: name.to_owned() }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a Service got no address. The Service then should have no ingress address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    /// A field of the Service cannot be read (an annotation that is not a list of addresses,
    /// two ways of asking that disagree, an unknown `spec.ipFamilies` entry).
    #[error("field {field}: {message}")]
    BadRequest {
        /// The field, e.g. `metadata.annotations[xlb.dev/loadBalancerIPs]`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The addresses asked for do not match `spec.ipFamilies` (one per family is needed).
    #[error("field {field}: {message}")]
    WrongFamily {
        /// The field that asks.
        field: String,
        /// Which family is missing or repeated.
        message: String,
    },
    /// An address asked for is in no pool.
    #[error("requested address {address} is in no address pool")]
    NotInPool {
        /// The address.
        address: IpAddr,
    },
    /// An address asked for is not in the pool the Service names.
    #[error("requested address {address} is not in pool {pool:?}, which the Service names")]
    NotInNamedPool {
        /// The address.
        address: IpAddr,
        /// The pool the annotation names.
        pool: String,
    },
    /// The addresses asked for are in different pools (a Service takes all its addresses from
    /// one pool).
    #[error(
        "requested addresses {first} (pool {first_pool:?}) and {second} (pool {second_pool:?}) are in different pools"
    )]
    MixedPools {
        /// One address.
        first: IpAddr,
        /// Its pool.
        first_pool: String,
        /// Another address.
        second: IpAddr,
        /// Its pool.
        second_pool: String,
    },
    /// An address asked for is held by another Service.
    #[error("requested address {address} is in use by Service {by}")]
    InUse {
        /// The address.
        address: IpAddr,
        /// Who holds it.
        by: ServiceKey,
    },
    /// The pool the Service names does not exist.
    #[error("address pool {pool:?} does not exist")]
    UnknownPool {
        /// The name given.
        pool: String,
    },
    /// The pool (named, or holding the requested address) does not allow this Service
    /// (`serviceAllocation.namespaces` or `serviceSelectors`).
    #[error("address pool {pool:?} does not allow this Service (serviceAllocation)")]
    PoolNotAllowed {
        /// The pool.
        pool: String,
    },
    /// The pool the Service names has no address of a family the Service needs.
    #[error("address pool {pool:?} has no {family} addresses")]
    PoolLacksFamily {
        /// The pool.
        pool: String,
        /// The family.
        family: Family,
    },
    /// No pool with `autoAssign` allows this Service and holds every family it needs.
    #[error("no address pool with autoAssign allows this Service and holds {}", families_list(.families))]
    NoPool {
        /// The families the Service needs.
        families: Vec<Family>,
    },
    /// Every pool the Service may use is full.
    #[error("no free address in address pool(s) {}", .pools.join(", "))]
    Exhausted {
        /// The pools tried, in order.
        pools: Vec<String>,
    },
}

fn families_list(f: &[Family]) -> String {
    f.iter().map(|f| f.name()).collect::<Vec<_>>().join(" and ")
}

/// The addresses a Service holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// One per family, in the order of `spec.ipFamilies`.
    pub addresses: Vec<IpAddr>,
    /// The pool they come from; `None` for a standalone static address outside every pool
    /// ([`Options::keep_addresses_outside_pools`]).
    pub pool: Option<String>,
    /// Whether the Service already held exactly these addresses in its status.
    pub kept: bool,
}

/// What [`assign`] decided for one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The Service holds these addresses.
    Assigned(Assigned),
    /// The Service gets no address, for this reason.
    Failed(AssignError),
}

impl Outcome {
    /// The addresses the Service's `status.loadBalancer.ingress` should list (empty when it
    /// failed).
    pub fn addresses(&self) -> &[IpAddr] {
        match self {
            Self::Assigned(a) => &a.addresses,
            Self::Failed(_) => &[],
        }
    }
}

/// The result of [`assign`]: one outcome per Service of xlb's class, by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    /// Every Service [`is_ours`] accepted.
    pub services: BTreeMap<ServiceKey, Outcome>,
}

impl Assignment {
    /// The Services whose status must change: those whose ingress addresses differ from the
    /// outcome's (in order), with the addresses to write.
    pub fn changes<'a>(&'a self, services: &'a [Arc<Service>]) -> Vec<(ServiceKey, &'a [IpAddr])> {
        let mut out = Vec::new();
        for s in services {
            let key = ServiceKey::of(s);
            if let Some(o) = self.services.get(&key)
                && ingress_ips(s) != o.addresses()
            {
                out.push((key, o.addresses()));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// The IP addresses of `status.loadBalancer.ingress[].ip`, in order (hostname-only entries
/// and unparsable ones left out).
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(|s| s.trim().parse().ok()))
        .collect()
}

/// Sets `status.loadBalancer.ingress` of `svc` to one `{ip}` entry per address (none: an
/// empty status), the in-memory form of what the Kubernetes controller writes.
pub fn apply_to_service(svc: &mut Service, addresses: &[IpAddr]) {
    let ingress: Vec<LoadBalancerIngress> =
        addresses.iter().map(|a| LoadBalancerIngress { ip: Some(a.to_string()), ..Default::default() }).collect();
    let status = svc.status.get_or_insert_with(ServiceStatus::default);
    status.load_balancer = Some(LoadBalancerStatus { ingress: (!ingress.is_empty()).then_some(ingress) });
}

/// What a Service asks for.
#[derive(Debug)]
struct Request {
    /// `spec.ipFamilies` (else the families of its cluster IPs, else IPv4).
    families: Vec<Family>,
    /// Addresses asked for, in the order of `families`, and the field that asks.
    ips: Option<(Vec<IpAddr>, String)>,
    /// The pool named by annotation.
    pool: Option<String>,
}

fn annotation<'a>(svc: &'a Service, keys: &[&'static str]) -> Result<Option<(&'static str, &'a str)>, AssignError> {
    let Some(ann) = svc.metadata.annotations.as_ref() else { return Ok(None) };
    let mut found: Option<(&'static str, &str)> = None;
    for k in keys {
        if let Some(v) = ann.get(*k) {
            match found {
                Some((fk, fv)) if fv.trim() != v.trim() => {
                    return Err(AssignError::BadRequest {
                        field: format!("metadata.annotations[{k}]"),
                        message: format!("{v:?} differs from annotation {fk} ({fv:?}); give one"),
                    });
                }
                Some(_) => {}
                None => found = Some((*k, v.as_str())),
            }
        }
    }
    Ok(found)
}

fn request(svc: &Service) -> Result<Request, AssignError> {
    let spec = svc.spec.as_ref();
    let mut families = Vec::new();
    if let Some(f) = spec.and_then(|s| s.ip_families.as_ref()).filter(|f| !f.is_empty()) {
        for (i, name) in f.iter().enumerate() {
            let fam = match name.as_str() {
                "IPv4" => Family::V4,
                "IPv6" => Family::V6,
                other => {
                    return Err(AssignError::BadRequest {
                        field: format!("spec.ipFamilies[{i}]"),
                        message: format!("{other:?} is not IPv4 or IPv6"),
                    });
                }
            };
            if !families.contains(&fam) {
                families.push(fam);
            }
        }
    } else {
        let ips = spec.and_then(|s| s.cluster_ips.clone()).filter(|v| !v.is_empty());
        let ips = ips.or_else(|| spec.and_then(|s| s.cluster_ip.clone()).map(|c| vec![c])).unwrap_or_default();
        for s in ips {
            if let Ok(a) = s.trim().parse::<IpAddr>()
                && !families.contains(&Family::of(a))
            {
                families.push(Family::of(a));
            }
        }
        if families.is_empty() {
            families.push(Family::V4);
        }
    }
    let ann =
        annotation(svc, &[ANNOTATION_LOAD_BALANCER_IPS, METALLB_LOAD_BALANCER_IPS, METALLB_LOAD_BALANCER_IPS_OLD])?;
    let spec_ip = spec.and_then(|s| s.load_balancer_ip.as_deref()).map(str::trim).filter(|s| !s.is_empty());
    let (text, field) = match (ann, spec_ip) {
        (Some((k, _)), Some(_)) => {
            return Err(AssignError::BadRequest {
                field: "spec.loadBalancerIP".into(),
                message: format!("set together with annotation {k}; give one"),
            });
        }
        (Some((k, v)), None) => (Some(v), format!("metadata.annotations[{k}]")),
        (None, Some(v)) => (Some(v), "spec.loadBalancerIP".to_owned()),
        (None, None) => (None, String::new()),
    };
    let ips = match text {
        None => None,
        Some(t) => {
            let mut by_family: BTreeMap<Family, IpAddr> = BTreeMap::new();
            for part in t.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let a: IpAddr = part.parse().map_err(|_| AssignError::BadRequest {
                    field: field.clone(),
                    message: format!("{part:?} is not an IP address"),
                })?;
                let fam = Family::of(a);
                if let Some(first) = by_family.insert(fam, a) {
                    return Err(AssignError::WrongFamily {
                        field,
                        message: format!("two {fam} addresses ({first} and {a}); give at most one per family"),
                    });
                }
                if !families.contains(&fam) {
                    return Err(AssignError::WrongFamily {
                        field,
                        message: format!("{a} is {fam} but spec.ipFamilies is {}", families_list(&families)),
                    });
                }
            }
            if by_family.is_empty() {
                return Err(AssignError::BadRequest { field, message: "lists no address".into() });
            }
            if let Some(missing) = families.iter().find(|f| !by_family.contains_key(f)) {
                return Err(AssignError::WrongFamily {
                    field,
                    message: format!(
                        "no {missing} address, but spec.ipFamilies is {}; give one per family",
                        families_list(&families)
                    ),
                });
            }
            Some((families.iter().filter_map(|f| by_family.get(f).copied()).collect(), field))
        }
    };
    let pool = annotation(svc, &[ANNOTATION_ADDRESS_POOL, METALLB_ADDRESS_POOL, METALLB_ADDRESS_POOL_OLD])?
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    Ok(Request { families, ips, pool })
}

fn labels(svc: &Service) -> BTreeMap<String, String> {
    svc.metadata.labels.clone().unwrap_or_default()
}

/// The pool all of `addrs` are in (`Ok(None)`: in no pool), or the first two that differ.
fn common_pool<'p>(pools: &'p PoolSet, addrs: &[IpAddr]) -> Result<Option<&'p Pool>, AssignError> {
    let mut first: Option<(IpAddr, Option<&Pool>)> = None;
    for &a in addrs {
        let p = pools.pool_of(a);
        match first {
            None => first = Some((a, p)),
            Some((fa, fp)) if fp.map(|p| &p.name) != p.map(|p| &p.name) => {
                let name = |p: Option<&Pool>| p.map_or_else(|| "none".to_owned(), |p| p.name.clone());
                return Err(AssignError::MixedPools {
                    first: fa,
                    first_pool: name(fp),
                    second: a,
                    second_pool: name(p),
                });
            }
            Some(_) => {}
        }
    }
    Ok(first.and_then(|(_, p)| p))
}

/// What pass 1 keeps of a Service's current ingress addresses.
enum Keep<'p> {
    /// One address per family: the Service is done.
    All(Assigned),
    /// Some families (in the order of `req.families`), all in `pool`; the others are
    /// taken from `pool` once every Service has kept what it may.
    Part { pool: &'p Pool, have: Vec<IpAddr> },
    /// Nothing.
    Nothing,
}

/// The current ingress addresses of `svc` the Service may keep (pass 1): all of them, ordered
/// as `req.families`, when they are one per family and may be kept together; otherwise, per
/// family of `req.families`, the first listed address of that family that is free, in the
/// pool of the first such address, and in a pool that allows the Service (and is the one it
/// names, if it names one). A Service that asks for addresses keeps them only as a whole.
fn keepable<'p>(
    pools: &'p PoolSet,
    svc: &Service,
    req: &Request,
    taken: &BTreeMap<IpAddr, ServiceKey>,
    opts: Options,
) -> Keep<'p> {
    let current = ingress_ips(svc);
    if let Some(a) = keepable_whole(pools, svc, req, &current, taken, opts) {
        return Keep::All(a);
    }
    if req.ips.is_some() {
        return Keep::Nothing;
    }
    let (ns, labels) = (ServiceKey::of(svc).namespace, labels(svc));
    let valid: Vec<(IpAddr, &Pool)> = current
        .iter()
        .filter(|a| req.families.contains(&Family::of(**a)) && !taken.contains_key(*a))
        .filter_map(|a| pools.pool_of(*a).map(|p| (*a, p)))
        .filter(|(_, p)| p.allows(&ns, &labels) && req.pool.as_ref().is_none_or(|n| *n == p.name))
        .collect();
    let Some(&(_, pool)) = valid.first() else { return Keep::Nothing };
    let have: Vec<IpAddr> = req
        .families
        .iter()
        .filter_map(|f| valid.iter().find(|(a, p)| p.name == pool.name && Family::of(*a) == *f).map(|(a, _)| *a))
        .collect();
    if have.len() == req.families.len() {
        return Keep::All(Assigned { addresses: have, pool: Some(pool.name.clone()), kept: false });
    }
    Keep::Part { pool, have }
}

/// The current ingress addresses of `svc`, ordered as `req.families`, if they are one per
/// family and the Service may keep them all.
fn keepable_whole(
    pools: &PoolSet,
    svc: &Service,
    req: &Request,
    current: &[IpAddr],
    taken: &BTreeMap<IpAddr, ServiceKey>,
    opts: Options,
) -> Option<Assigned> {
    if current.len() != req.families.len() {
        return None;
    }
    let mut ordered = Vec::with_capacity(current.len());
    for f in &req.families {
        let mut of_f = current.iter().filter(|a| Family::of(**a) == *f);
        let a = *of_f.next()?;
        if of_f.next().is_some() {
            return None;
        }
        ordered.push(a);
    }
    if let Some((ips, _)) = &req.ips
        && *ips != ordered
    {
        return None;
    }
    if ordered.iter().any(|a| taken.contains_key(a)) {
        return None;
    }
    let pool = common_pool(pools, &ordered).ok()?;
    match pool {
        None => (opts.keep_addresses_outside_pools && req.pool.is_none()).then_some(()),
        Some(p) => (p.allows(&ServiceKey::of(svc).namespace, &labels(svc))
            && req.pool.as_ref().is_none_or(|n| *n == p.name))
        .then_some(()),
    }?;
    // `kept` only when the status already lists them in family order; otherwise the status
    // is rewritten in that order.
    let kept = current == ordered;
    Some(Assigned { addresses: ordered, pool: pool.map(|p| p.name.clone()), kept })
}

/// Pass 1b: completes the addresses a Service kept for some of its families with the lowest
/// free ones of `pool` for the others, avoiding `avoid` (the addresses Services ask for).
/// `None` when `pool` may not serve them automatically (no `autoAssign` and not named by the
/// Service) or has no room.
fn completed(
    pool: &Pool,
    req: &Request,
    have: &[IpAddr],
    taken: &BTreeMap<IpAddr, ServiceKey>,
    avoid: &BTreeSet<IpAddr>,
) -> Option<Assigned> {
    if !pool.auto_assign && req.pool.as_ref() != Some(&pool.name) {
        return None;
    }
    let mut addresses = Vec::with_capacity(req.families.len());
    for f in &req.families {
        match have.iter().find(|a| Family::of(**a) == *f) {
            Some(a) => addresses.push(*a),
            None => addresses.push(pool.first_free(*f, None, |a| taken.contains_key(&a) || avoid.contains(&a))?),
        }
    }
    Some(Assigned { addresses, pool: Some(pool.name.clone()), kept: false })
}

/// Pass 2: the addresses a Service asks for.
fn requested(
    pools: &PoolSet,
    svc: &Service,
    req: &Request,
    ips: &[IpAddr],
    taken: &BTreeMap<IpAddr, ServiceKey>,
    opts: Options,
) -> Result<Assigned, AssignError> {
    let pool = common_pool(pools, ips)?;
    match (pool, &req.pool) {
        (None, _) if !opts.keep_addresses_outside_pools || req.pool.is_some() => {
            let address = ips[0];
            return Err(match &req.pool {
                Some(p) if pools.by_name(p).is_some() => AssignError::NotInNamedPool { address, pool: p.clone() },
                Some(p) => AssignError::UnknownPool { pool: p.clone() },
                None => AssignError::NotInPool { address },
            });
        }
        (Some(p), Some(named)) if p.name != *named => {
            return Err(if pools.by_name(named).is_some() {
                AssignError::NotInNamedPool { address: ips[0], pool: named.clone() }
            } else {
                AssignError::UnknownPool { pool: named.clone() }
            });
        }
        (Some(p), _) if !p.allows(&ServiceKey::of(svc).namespace, &labels(svc)) => {
            return Err(AssignError::PoolNotAllowed { pool: p.name.clone() });
        }
        _ => {}
    }
    if let Some((a, by)) = ips.iter().find_map(|a| taken.get(a).map(|by| (*a, by))) {
        return Err(AssignError::InUse { address: a, by: by.clone() });
    }
    Ok(Assigned { addresses: ips.to_vec(), pool: pool.map(|p| p.name.clone()), kept: false })
}

/// Pass 3: the lowest free addresses of the first pool with room.
fn automatic(
    pools: &PoolSet,
    svc: &Service,
    req: &Request,
    taken: &BTreeMap<IpAddr, ServiceKey>,
    hints: &mut BTreeMap<(String, Family), IpAddr>,
) -> Result<Assigned, AssignError> {
    let ns = ServiceKey::of(svc).namespace;
    let labels = labels(svc);
    let candidates: Vec<&Pool> = match &req.pool {
        Some(name) => {
            let p = pools.by_name(name).ok_or_else(|| AssignError::UnknownPool { pool: name.clone() })?;
            if !p.allows(&ns, &labels) {
                return Err(AssignError::PoolNotAllowed { pool: p.name.clone() });
            }
            if let Some(f) = req.families.iter().find(|f| !p.has_family(**f)) {
                return Err(AssignError::PoolLacksFamily { pool: p.name.clone(), family: *f });
            }
            vec![p]
        }
        None => {
            let mut c: Vec<&Pool> = pools
                .pools()
                .iter()
                .filter(|p| p.auto_assign && p.allows(&ns, &labels) && req.families.iter().all(|f| p.has_family(*f)))
                .collect();
            c.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
            c
        }
    };
    if candidates.is_empty() {
        return Err(AssignError::NoPool { families: req.families.clone() });
    }
    for p in &candidates {
        let mut got = Vec::with_capacity(req.families.len());
        for f in &req.families {
            let hint = hints.get(&(p.name.clone(), *f)).copied();
            match p.first_free(*f, hint, |a| taken.contains_key(&a)) {
                Some(a) => got.push(a),
                None => break,
            }
        }
        if got.len() == req.families.len() {
            for a in &got {
                hints.insert((p.name.clone(), Family::of(*a)), *a);
            }
            return Ok(Assigned { addresses: got, pool: Some(p.name.clone()), kept: false });
        }
    }
    Err(AssignError::Exhausted { pools: candidates.iter().map(|p| p.name.clone()).collect() })
}

/// Assigns addresses to the LoadBalancer Services of xlb's class (see the module docs for
/// the rules). Pure and deterministic: the same pools and Services, in any order, give the
/// same [`Assignment`]; feeding its addresses back as the Services' status gives it again.
/// Services for which [`is_ours`] is false are not in the result and hold no address.
/// Duplicate keys in `services` (which a consistent snapshot does not have) count once: the
/// first in the (creationTimestamp, namespace, name) order.
pub fn assign(pools: &PoolSet, services: &[Arc<Service>], filter: &ClassFilter, opts: Options) -> Assignment {
    let mut ours: Vec<(&Service, ServiceKey)> =
        services.iter().filter(|s| is_ours(s, filter)).map(|s| (s.as_ref(), ServiceKey::of(s))).collect();
    ours.sort_by(|a, b| {
        a.0.metadata.creation_timestamp.cmp(&b.0.metadata.creation_timestamp).then_with(|| a.1.cmp(&b.1))
    });
    let mut seen = BTreeSet::new();
    ours.retain(|(_, k)| seen.insert(k.clone()));

    let mut taken: BTreeMap<IpAddr, ServiceKey> = BTreeMap::new();
    let mut out: BTreeMap<ServiceKey, Outcome> = BTreeMap::new();
    let mut pending: Vec<(usize, &Service, ServiceKey, Request)> = Vec::new();
    let mut partial = Vec::new();
    // Pass 1: keep what the status holds, per family when not all of it can be kept.
    for (i, (svc, key)) in ours.into_iter().enumerate() {
        let req = match request(svc) {
            Ok(r) => r,
            Err(e) => {
                out.insert(key, Outcome::Failed(e));
                continue;
            }
        };
        match keepable(pools, svc, &req, &taken, opts) {
            Keep::All(a) => {
                for addr in &a.addresses {
                    taken.insert(*addr, key.clone());
                }
                out.insert(key, Outcome::Assigned(a));
            }
            Keep::Part { pool, have } => {
                for addr in &have {
                    taken.insert(*addr, key.clone());
                }
                partial.push((i, svc, key, req, pool, have));
            }
            Keep::Nothing => pending.push((i, svc, key, req)),
        }
    }
    // Pass 1b: a Service that kept some families gets the others from the same pool, if it
    // can without an address another Service asks for; otherwise it is assigned afresh.
    let asked: BTreeSet<IpAddr> =
        pending.iter().filter_map(|(_, _, _, r)| r.ips.as_ref()).flat_map(|(ips, _)| ips.iter().copied()).collect();
    for (i, svc, key, req, pool, have) in partial {
        match completed(pool, &req, &have, &taken, &asked) {
            Some(a) => {
                for addr in &a.addresses {
                    taken.insert(*addr, key.clone());
                }
                out.insert(key, Outcome::Assigned(a));
            }
            None => {
                for addr in &have {
                    taken.remove(addr);
                }
                pending.push((i, svc, key, req));
            }
        }
    }
    pending.sort_by_key(|(i, ..)| *i);
    // Pass 2: explicit requests, before any automatic choice can take their addresses.
    let mut rest = Vec::new();
    for (_, svc, key, req) in pending {
        let Some((ips, _)) = &req.ips else {
            rest.push((svc, key, req));
            continue;
        };
        let o = match requested(pools, svc, &req, ips, &taken, opts) {
            Ok(a) => {
                for addr in &a.addresses {
                    taken.insert(*addr, key.clone());
                }
                Outcome::Assigned(a)
            }
            Err(e) => Outcome::Failed(e),
        };
        out.insert(key, o);
    }
    // Pass 3: automatic.
    let mut hints = BTreeMap::new();
    for (svc, key, req) in rest {
        let o = match automatic(pools, svc, &req, &taken, &mut hints) {
            Ok(a) => {
                for addr in &a.addresses {
                    taken.insert(*addr, key.clone());
                }
                Outcome::Assigned(a)
            }
            Err(e) => Outcome::Failed(e),
        };
        out.insert(key, o);
    }
    Assignment { services: out }
}
