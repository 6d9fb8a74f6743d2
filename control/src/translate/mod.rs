//! Translation of Kubernetes objects into dataplane tables: the one pure function
//! [`build_spec`], shared by `xlb run --config` (standalone) and the Kubernetes source.
//!
//! # What becomes what
//! Each Service port (PORT-02) and each address family of the Service's `spec.clusterIPs`
//! (DS-01) gives one [`ServiceSpec`] named `namespace/name:port` (the port's name, or its
//! number when unnamed), with `/ipv4` or `/ipv6` appended for the second family of a
//! dual-stack Service. Its frontends, keyed by (IP, protocol, port) (PORT-03):
//! - the cluster IP of that family (SVC-01; "internal" traffic);
//! - "external" traffic (TP-03): one NodePort frontend per selected node address of that
//!   family (SVC-02, SVC-05, NPA-01..07), each `spec.externalIPs[]` (SVC-11), and each
//!   `status.loadBalancer.ingress[].ip` of a LoadBalancer Service, whatever its
//!   `loadBalancerClass` (SVC-06, SVC-08: the class picks who provisions and announces the
//!   address, not who forwards to it; kube-proxy's `pkg/proxy/serviceport.go`).
//!
//! Addresses of a family the Service has no cluster IP for are ignored, as kube-proxy's
//! per-family proxiers do, and an IPv4 frontend only ever gets IPv4 backends (DS-03).
//! When the internal and external classes select different backends (a `Local` policy on
//! one side, or topology that only the `Cluster` side uses), the external frontends move to a
//! second spec named `…/external`.
//!
//! # Backends
//! Every endpoint of the Service's EndpointSlices (joined by the `kubernetes.io/service-name`
//! label, EPS-01) of the right address type and with a port entry that matches the Service
//! port's name and protocol (PORT-04) becomes a backend, deduplicated by address (EPS-09).
//! Only the endpoints the traffic policy and topology select are eligible for new flows
//! (weight 1); the others stay as weight-0 members so established flows to them are kept
//! (graceful termination, CT-03, TP-07).
//!
//! # Errors
//! Nothing here fails the whole table because of one object: a bad Service is skipped and
//! reported with the field at fault ([`TranslateReport`]), the rest is built. Only an
//! invalid [`Config`] is a [`TranslateError`]. Decisions on the rule book's open points:
//! - EPS-11: only `addresses[0]` of an endpoint is used (kube-proxy does the same; the API
//!   documents the other entries as duplicates for consumers that ignore them).
//! - EPS-09: duplicates across slices keep the first copy in slice-name order, except that a
//!   node-local copy replaces a remote one (kube-proxy's rule).
//! - LB-01: a `loadBalancerSourceRanges` entry that is not a CIDR is an error naming the
//!   entry; that Service's LoadBalancer ingress frontends are then left out (fail closed: an
//!   unreadable allow-list never opens the LB address to everyone), its ClusterIP and NodePort
//!   frontends stay. Host bits are masked (`10.0.0.1/8` = `10.0.0.0/8`) as the API server's
//!   parser allows them.
//! - REJ-01/02: a `Local` class drops new flows when the cluster has usable endpoints but
//!   this node has none; when the Service has no usable endpoint at all, it rejects like
//!   kube-proxy does (REJ-03/04, ICMP port unreachable).
//! - EPS-05: `publishNotReadyAddresses: true` makes every endpoint count as ready, as the
//!   EndpointSlice controller does for such Services (also for hand-written slices).
//! - PORT-05: when the matching slice port has no `port` number, a numeric `targetPort` (or
//!   the Service `port` when `targetPort` is unset) is used.

mod incremental;
mod index;
mod select;

pub use incremental::{HostFacts, UpdateStats};
pub use index::ClusterIndex;

/// Parses an address from field `field` of object `label`; a bad one is reported as an error
/// naming the field (only that address is skipped) and gives `None`.
fn parse_sourced(s: &str, field: String, what: &str, label: &str, report: &mut TranslateReport) -> Option<SourcedAddr> {
    match s.trim().parse::<IpAddr>() {
        Ok(addr) => Some(SourcedAddr { addr, field }),
        Err(_) => {
            report.issues.push(Issue {
                severity: Severity::Error,
                object: label.to_owned(),
                field,
                message: format!("{s:?} is not an IP address; this {what} is not programmed"),
            });
            None
        }
    }
}

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use dataplane::addr::Cidr;
use dataplane::tables::{
    BackendSpec, Conditions, ForwardingMode, Frontend, FrontendKind, L4Proto, NeighbourSpec, PortSpec, RouteSpec,
    Scheduler, ServiceSpec, TablesSpec,
};
use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config::{Config, NodePortAddress};
use select::{Ep, Policy, Selection};

/// Label that joins an EndpointSlice to its Service (EPS-01).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label that hands a Service to another proxy; kube-proxy ignores such Services, so do we.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Node label with the node's zone (TOPO-10).
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Annotation whose value `Auto` asks the EndpointSlice controller for zone hints and
/// overrides `trafficDistribution` (TOPO-06). Read by that controller, not by xlb, which
/// applies whatever hints the slices carry (like kube-proxy).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// Legacy form of [`ANNOTATION_TOPOLOGY_MODE`] (value `auto`, TOPO-12); likewise not read by
/// xlb.
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// Per-Service scheduler override (IPVS scheduler name; G-13).
pub const ANNOTATION_SCHEDULER: &str = "xlb.dev/scheduler";
/// Per-Service forwarding mode override (`nat`, `dsr-ipip`, `dsr-l2`).
pub const ANNOTATION_FORWARDING_MODE: &str = "xlb.dev/forwarding-mode";
/// Legacy annotation for `loadBalancerSourceRanges` (comma-separated), used when the field is
/// empty, as kube-proxy does.
pub const ANNOTATION_SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
/// Default ClientIP affinity timeout in seconds: 10800 = 3 h (AFF-02).
pub const AFFINITY_DEFAULT_TIMEOUT_S: u32 = 10800;
/// Largest ClientIP affinity timeout in seconds: 86400 = 1 day (AFF-03).
pub const AFFINITY_MAX_TIMEOUT_S: u32 = 86400;
/// MTU (bytes) given to ports until the running process reads the interface's own.
pub const PLACEHOLDER_MTU: u16 = 1500;

/// The Kubernetes objects a table is built from. Objects are shared (`Arc`): the Kubernetes
/// source hands over the watch caches' own objects, so a snapshot copies pointers, not
/// objects (a deep copy of 10,000 Services and their slices took ~58 ms).
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// Every Service (any namespace).
    pub services: Vec<Arc<Service>>,
    /// Every EndpointSlice (any namespace).
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// This node's own Node object, if known (addresses, zone label).
    pub node: Option<Node>,
    /// Addresses of this host's interfaces (`RTM_GETADDR` in the namespace xlb runs in; `xlb
    /// run` reads them and follows changes). NodePorts answer on them too, after the config's
    /// `nodeAddresses` and the Node's `status.addresses`, when `nodePortAddresses` lets them
    /// (NPA-02: unset = all; NPA-01: CIDRs), as kube-proxy's `--dst-type LOCAL` match does
    /// (NPA-04); they never count as the node's primary address (NPA-07). Loopback and IPv6
    /// link-local addresses are left out. Empty in `xlb check` and in tests unless set.
    pub local_addresses: Vec<IpAddr>,
}

/// How serious a reported problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Something the object asks for is not programmed (the object or a part of it is
    /// skipped); `xlb check` exits 1.
    Error,
    /// Something was ignored or assumed; the result is what kube-proxy would do.
    Warning,
}

/// One reported problem, naming the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Issue {
    /// Error or warning.
    pub severity: Severity,
    /// The object, e.g. `Service default/web` or `EndpointSlice default/web-abc`.
    pub object: String,
    /// Field path, e.g. `spec.clusterIP` or `endpoints[2].addresses[0]`.
    pub field: String,
    /// What is wrong and what was done about it.
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{sev}: {}, field {}: {}", self.object, self.field, self.message)
    }
}

/// Counts of `Local`-policy service ports with endpoints in the cluster but none on this node
/// (kube-proxy's `kubeproxy_sync_proxy_rules_no_local_endpoints_total`, MET-04).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    /// `internalTrafficPolicy: Local` (label `traffic_policy="internal"`).
    pub internal: u64,
    /// `externalTrafficPolicy: Local` (label `traffic_policy="external"`).
    pub external: u64,
}

/// What [`build_spec`] noticed besides the tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TranslateReport {
    /// Problems, sorted and deduplicated.
    pub issues: Vec<Issue>,
    /// MET-04 counts.
    pub no_local_endpoints: NoLocalEndpoints,
}

impl TranslateReport {
    /// Whether any [`Severity::Error`] was reported.
    pub fn has_errors(&self) -> bool {
        self.issues.iter().any(|i| i.severity == Severity::Error)
    }
}

/// The configuration cannot be used to build tables at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// A config field is invalid (see [`Config::validate`]).
    #[error("invalid configuration, field {field}: {message}")]
    Config {
        /// Field path in the xlb configuration document.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// Builds the dataplane's [`TablesSpec`] from Kubernetes objects and the xlb configuration.
///
/// Pure and deterministic: Services are emitted sorted by namespace and name, then port
/// order, family order, internal before external; backends sorted by address.
///
/// `ports` get MAC 00:00:00:00:00:00 and MTU [`PLACEHOLDER_MTU`]; the running process
/// replaces them with the interfaces' own values.
///
/// # Errors
/// [`TranslateError`] only for an invalid `cfg`; bad objects are skipped and listed in the
/// [`TranslateReport`].
pub fn build_spec(input: &ClusterState, cfg: &Config) -> Result<(TablesSpec, TranslateReport), TranslateError> {
    Translator::new().build(input, cfg)
}

/// The order objects are taken in: namespace (`default` when unset, as everywhere in the
/// translation), then name. Services are translated in this order; the Kubernetes source
/// hands its snapshot over sorted by it, so the translation need not sort again.
pub fn object_order(m: &ObjectMeta) -> (&str, &str) {
    (m.namespace.as_deref().unwrap_or("default"), m.name.as_deref().unwrap_or_default())
}

/// Hash map with foldhash (the keys are our own objects' names, not attacker-chosen packets).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
/// Hash set with foldhash.
type FastSet<K> = HashSet<K, foldhash::fast::RandomState>;

/// Which version of a Service and of its EndpointSlices a cached translation was made from:
/// `metadata.resourceVersion` of each (slices by name, in name order).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Versions {
    service: String,
    slices: Vec<(String, String)>,
}

impl Versions {
    /// `None` when an object has no resourceVersion (objects from a file): such a Service is
    /// translated every time.
    fn of(svc: &Service, slices: &[&EndpointSlice]) -> Option<Self> {
        let service = svc.metadata.resource_version.clone()?;
        let slices = slices
            .iter()
            .map(|s| Some((s.metadata.name.clone().unwrap_or_default(), s.metadata.resource_version.clone()?)))
            .collect::<Option<Vec<_>>>()?;
        Some(Self { service, slices })
    }

    /// Whether these are the versions of `svc` and `slices`, without allocating.
    fn matches(&self, svc: &Service, slices: &[&EndpointSlice]) -> bool {
        svc.metadata.resource_version.as_deref() == Some(self.service.as_str())
            && self.slices.len() == slices.len()
            && self.slices.iter().zip(slices).all(|((name, rv), s)| {
                s.metadata.name.as_deref().unwrap_or_default() == name
                    && s.metadata.resource_version.as_deref() == Some(rv.as_str())
            })
    }
}

/// One Service's translation, kept for the next build.
#[derive(Debug, Clone)]
struct Cached {
    result: Result<Vec<Pending>, Issue>,
    issues: Vec<Issue>,
    no_local: NoLocalEndpoints,
}

/// How many Services the last [`Translator::build`] or [`Translator::update`] translated and
/// how many it reused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TranslateStats {
    /// Services translated from their objects.
    pub translated: usize,
    /// Services whose previous translation was reused.
    pub reused: usize,
}

/// [`build_spec`] that remembers each Service's translation and translates again only the
/// Services whose objects changed (SYNC-03: a change rebuilds only the Services it touches).
///
/// A cached translation is reused when the Service's `metadata.resourceVersion` and the
/// names and resourceVersions of its EndpointSlices are those it was made from, and the
/// xlb configuration and this node's Node object are equal to the previous build's (any
/// change of those translates everything). The API server changes a resourceVersion on every
/// write, so this needs no list of changes from the watcher, and a slice that moves to another
/// Service changes both Services' slice lists. Objects without a resourceVersion (from a
/// file) are always translated. The result is always equal to [`build_spec`]'s for the same
/// input (pinned by a test); only the time differs.
///
/// Two independent ways in: [`Translator::build`] walks a flat [`ClusterState`] every time
/// (the file source, SIGHUP reloads, `xlb check`), and [`Translator::update`] keeps the whole
/// translation ([`Translator::spec`], [`Translator::report`]) and applies a change set from
/// an indexed [`ClusterIndex`] in O(changed Services) (the Kubernetes source).
#[derive(Debug, Default)]
pub struct Translator {
    /// Config and Node the cache was made with.
    basis: Option<(Config, Option<Node>)>,
    /// By (namespace, name): the versions a translation was made from, and the translation.
    cache: FastMap<(String, String), (Versions, Cached)>,
    stats: TranslateStats,
    /// Threads that translate Services (0: `std::thread::available_parallelism`).
    threads: usize,
    /// The translation kept by [`Translator::update`].
    incr: incremental::Incremental,
}

impl Translator {
    /// A translator with nothing cached.
    pub fn new() -> Self {
        Self::default()
    }

    /// Services translated and reused by the last [`Translator::build`].
    pub fn stats(&self) -> TranslateStats {
        self.stats
    }

    /// Sets how many threads translate the Services of one build that need it: the calling
    /// thread and `n - 1` scoped helpers (unpinned), each taking the next
    /// [`TRANSLATE_PER_CLAIM`] Services in turn; 1 translates on the calling thread only; 0
    /// (the default) means `std::thread::available_parallelism()`. Another thread is used
    /// only for every [`TRANSLATE_PER_THREAD`] Services to translate, so a change (one
    /// Service) starts none. The result does not depend on `n`: each Service's translation
    /// depends only on its own objects, the config and the Node, and is put back in Service
    /// order.
    pub fn set_threads(&mut self, n: usize) {
        self.threads = n;
    }

    /// Builds the [`TablesSpec`] for `input`, as [`build_spec`] does, reusing the cached
    /// translations of unchanged Services.
    ///
    /// # Errors
    /// As [`build_spec`]: only for an invalid `cfg` (then the cache is left as it was).
    pub fn build(
        &mut self,
        input: &ClusterState,
        cfg: &Config,
    ) -> Result<(TablesSpec, TranslateReport), TranslateError> {
        cfg.validate().map_err(|e| TranslateError::Config { field: e.field, message: e.message })?;
        if self.basis.as_ref().is_none_or(|(c, n)| c != cfg || n.as_ref() != input.node.as_ref()) {
            self.cache.clear();
            self.basis = Some((cfg.clone(), input.node.clone()));
        }
        let threads = match self.threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        };
        let (spec, report, stats) = assemble(input, cfg, &mut self.cache, threads);
        self.stats = stats;
        Ok((spec, report))
    }
}

/// The body of [`Translator::build`] (and so of [`build_spec`]): every Service through
/// `cache`, then the cross-Service checks (table names, frontend collisions) and the global
/// fields. Entries of Services that no longer exist are dropped from `cache`.
fn assemble(
    input: &ClusterState,
    cfg: &Config,
    cache: &mut FastMap<(String, String), (Versions, Cached)>,
    threads: usize,
) -> (TablesSpec, TranslateReport, TranslateStats) {
    let mut report = TranslateReport::default();
    let mut stats = TranslateStats::default();
    let node = NodeInfo::new(input.node.as_ref(), &input.local_addresses, cfg, &mut report);
    let node_port_addrs = node.node_port_addresses(cfg);

    let mut slices: FastMap<(&str, &str), Vec<&EndpointSlice>> = FastMap::default();
    for s in &input.endpoint_slices {
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(svc) = s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) {
            slices.entry((ns, svc.as_str())).or_default().push(s);
        }
    }
    for v in slices.values_mut() {
        v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }

    let mut services: Vec<&Service> = input.services.iter().map(|s| &**s).collect();
    // The Kubernetes source hands them over sorted already: check (n compares) before sorting.
    if !services.is_sorted_by(|a, b| object_order(&a.metadata) <= object_order(&b.metadata)) {
        services.sort_by(|a, b| object_order(&a.metadata).cmp(&object_order(&b.metadata)));
    }

    let ctx = Ctx { cfg, node: &node, node_port_addrs: &node_port_addrs };
    let label_of = |svc: &Service| {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        format!("Service {ns}/{}", svc.metadata.name.as_deref().unwrap_or_default())
    };
    // Pass 1: bring every Service's translation up to date (translating only those whose
    // objects changed, on several threads when there are many: `par_map`). Translations of
    // unversioned objects are not cached: kept aside.
    fn slices_for<'m>(
        slices: &'m FastMap<(&'m str, &'m str), Vec<&'m EndpointSlice>>,
        svc: &'m Service,
    ) -> &'m [&'m EndpointSlice] {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        slices.get(&(ns, name)).map_or(&[][..], Vec::as_slice)
    }
    let stale: Vec<&Service> = services
        .iter()
        .copied()
        .filter(|svc| {
            let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
            let name = svc.metadata.name.as_deref().unwrap_or_default();
            !cache.get(&(ns.to_owned(), name.to_owned())).is_some_and(|(v, _)| v.matches(svc, slices_for(&slices, svc)))
        })
        .collect();
    let mut translated = par_map(stale.len(), threads, |i| {
        let svc = stale.get(i)?;
        let mut own = TranslateReport::default();
        let result = translate_service(svc, slices_for(&slices, svc), &ctx, &label_of(svc), &mut own);
        Some(Cached { result, issues: own.issues, no_local: own.no_local_endpoints })
    })
    .into_iter()
    .zip(stale)
    .peekable();
    let mut seen: FastSet<(String, String)> = FastSet::default();
    seen.reserve(input.services.len());
    let mut order: Vec<((String, String), Option<Cached>)> = Vec::with_capacity(services.len());
    for svc in &services {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let svc_slices = slices_for(&slices, svc);
        let key = (ns.to_owned(), name.to_owned());
        let mut uncached = None;
        // `stale` is in Service order: its next entry is this Service if it was translated.
        let fresh = translated.next_if(|(_, s)| std::ptr::eq(*s, *svc)).and_then(|(c, _)| c);
        if let Some(c) = fresh {
            stats.translated += 1;
            match Versions::of(svc, svc_slices) {
                Some(versions) => {
                    cache.insert(key.clone(), (versions, c));
                }
                None => {
                    cache.remove(&key);
                    uncached = Some(c);
                }
            }
        } else {
            stats.reused += 1;
        }
        seen.insert(key.clone());
        order.push((key, uncached));
    }
    cache.retain(|k, _| seen.contains(k));

    // Pass 2: the cross-Service checks, in Service order, reading the translations in place
    // (specs are shared with the cache; only one that loses a frontend is copied).
    let mut claimed: FastMap<(IpAddr, L4Proto, u16), &str> = FastMap::default();
    let mut names: FastSet<&str> = FastSet::default();
    let mut out = Vec::with_capacity(order.len());
    let cache = &*cache;
    for ((key, uncached), svc) in order.iter().zip(&services) {
        let Some(c) = uncached.as_ref().or_else(|| cache.get(key).map(|(_, c)| c)) else { continue };
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
            // when none is.
            let mut kept = Vec::with_capacity(p.frontends.len());
            for (f, field) in p.frontends.iter().zip(fields) {
                let key = (f.addr, f.proto, f.port);
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

/// The name-collision issue: a later spec named like an earlier one (table names are unique).
fn name_taken(object: String, name: &str) -> Issue {
    Issue {
        severity: Severity::Error,
        object,
        field: "metadata.name".into(),
        message: format!("table name {name:?} is already used; not programmed"),
    }
}

/// The frontend-collision issue: `f` (from `field` of `object`) is a frontend of the earlier
/// spec `owner`.
fn frontend_taken(object: String, field: &str, f: &Frontend, owner: &str) -> Issue {
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
fn maglev_overflow(p: &ServiceSpec, cfg: &Config, label: impl FnOnce() -> String) -> Option<Issue> {
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
fn needs_snat(s: &ServiceSpec, fam: Family, off_cluster: bool) -> bool {
    s.mode == ForwardingMode::Nat
        && s.frontends.iter().any(|f| {
            let off = f.kind == FrontendKind::ClusterIp && off_cluster;
            (f.masquerade || off) && Family::of(f.addr) == fam
        })
}

/// The warning when masqueraded frontends of `fam` exist and there is no SNAT address.
fn snat_missing(fam: Family) -> Issue {
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
fn globals(cfg: &Config, node: &NodeInfo) -> TablesSpec {
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
        // NAT-06: ClusterIP traffic from outside the pod CIDRs is masqueraded (kube-proxy's
        // `detectLocalMode: ClusterCIDR`); with masqueradeAll everything is anyway.
        cluster_cidrs: if cfg.iptables.masquerade_all { Vec::new() } else { cfg.cluster_cidr.clone() },
    }
}

/// Services a translation thread claims at a time (one atomic add per claim).
pub const TRANSLATE_PER_CLAIM: usize = 64;

/// A build uses another translation thread only for every this many Services to translate
/// (a Service of 10 endpoints takes a few microseconds; a thread tens to start).
pub const TRANSLATE_PER_THREAD: usize = 512;

/// `(0..n).map(f)` on up to `threads` threads (scoped; the calling thread is one), in index
/// order. A helper that cannot be started or that panicked leaves its indices to the
/// calling thread, so the result is always complete and equal to the one-thread result.
fn par_map<T: Send>(n: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = threads.min(n / TRANSLATE_PER_THREAD).max(1);
    if threads == 1 {
        return (0..n).map(&f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut out = Vec::new();
        loop {
            let from = next.fetch_add(TRANSLATE_PER_CLAIM, std::sync::atomic::Ordering::Relaxed);
            if from >= n {
                break;
            }
            out.extend((from..n.min(from + TRANSLATE_PER_CLAIM)).map(|i| (i, f(i))));
        }
        out
    };
    let mut results: Vec<Option<T>> = std::iter::repeat_with(|| None).take(n).collect();
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads)
            .filter_map(|_| std::thread::Builder::new().name("xlb-translate".into()).spawn_scoped(s, work).ok())
            .collect();
        let mine = work();
        for (i, r) in helpers.into_iter().filter_map(|h| h.join().ok()).flatten().chain(mine) {
            if let Some(slot) = results.get_mut(i) {
                *slot = Some(r);
            }
        }
    });
    results.into_iter().enumerate().map(|(i, r)| r.unwrap_or_else(|| f(i))).collect()
}

// ---------------------------------------------------------------------------------------

/// Address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn of(a: IpAddr) -> Self {
        if a.is_ipv4() { Self::V4 } else { Self::V6 }
    }
    /// The EndpointSlice `addressType` / Service `ipFamilies` spelling.
    fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
    fn lower(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }
}

/// Whether a node address came in as `InternalIP` (or from the config) or `ExternalIP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddrType {
    Internal,
    External,
    /// An interface address that the Node object does not list.
    Local,
}

/// This node as the translation sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NodeInfo {
    name: Option<String>,
    zone: Option<String>,
    /// In order: config `nodeAddresses`, then Node `status.addresses` (NPA-07).
    addresses: Vec<(IpAddr, AddrType)>,
}

impl NodeInfo {
    fn new(node: Option<&Node>, local: &[IpAddr], cfg: &Config, report: &mut TranslateReport) -> Self {
        let name = cfg.node_name().map(str::to_owned).or_else(|| node.and_then(|n| n.metadata.name.clone()));
        let zone = node
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(LABEL_ZONE))
            .filter(|z| !z.is_empty())
            .cloned();
        let mut addresses: Vec<(IpAddr, AddrType)> = Vec::new();
        let mut push = |a: IpAddr, t: AddrType| {
            // NPA-05: loopback NodePorts cannot be served from XDP; never use them.
            if a.is_loopback() || a.is_unspecified() || addresses.iter().any(|(x, _)| *x == a) {
                return;
            }
            addresses.push((a, t));
        };
        for a in &cfg.node_addresses {
            push(*a, AddrType::Internal);
        }
        if let Some(n) = node {
            let label = format!("Node {}", n.metadata.name.as_deref().unwrap_or_default());
            let list = n.status.as_ref().and_then(|s| s.addresses.as_ref());
            for (i, na) in list.into_iter().flatten().enumerate() {
                let t = match na.type_.as_str() {
                    "InternalIP" => AddrType::Internal,
                    "ExternalIP" => AddrType::External,
                    _ => continue, // Hostname, InternalDNS, ExternalDNS
                };
                match na.address.trim().parse::<IpAddr>() {
                    Ok(a) => push(a, t),
                    Err(_) => report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label.clone(),
                        field: format!("status.addresses[{i}].address"),
                        message: format!("{:?} is not an IP address; ignored", na.address),
                    }),
                }
            }
        }
        for a in local {
            // IPv6 link-local addresses need a zone to mean anything; a NodePort there is not one.
            if matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()) {
                continue;
            }
            push(*a, AddrType::Local);
        }
        Self { name, zone, addresses }
    }

    /// The primary address of a family: the first InternalIP, else the first ExternalIP
    /// (kubelet `--node-ip` semantics, NPA-07).
    fn primary(&self, fam: Family) -> Option<IpAddr> {
        let of = |t: AddrType| self.addresses.iter().find(|(a, at)| *at == t && Family::of(*a) == fam).map(|(a, _)| *a);
        of(AddrType::Internal).or_else(|| of(AddrType::External))
    }

    /// Node addresses that serve NodePorts (NPA-01..04).
    fn node_port_addresses(&self, cfg: &Config) -> Vec<IpAddr> {
        if cfg.node_port_addresses.is_empty() {
            // NPA-02 (iptables default): every node address.
            return self.addresses.iter().map(|(a, _)| *a).collect();
        }
        let primary = cfg.node_port_addresses.contains(&NodePortAddress::Primary);
        let primaries = [self.primary(Family::V4), self.primary(Family::V6)];
        self.addresses
            .iter()
            .map(|(a, _)| *a)
            .filter(|a| {
                (primary && primaries.contains(&Some(*a)))
                    || cfg.node_port_addresses.iter().any(|s| match s {
                        NodePortAddress::Cidr(c) => c.contains(*a),
                        NodePortAddress::Primary => false,
                    })
            })
            .collect()
    }
}

struct Ctx<'a> {
    cfg: &'a Config,
    node: &'a NodeInfo,
    node_port_addrs: &'a [IpAddr],
}

/// A Service's spec before the cross-Service checks (table names, frontend collisions), shared
/// with every build that reuses it; `fields[i]` names the Service field that
/// `spec.frontends[i]` comes from, for error messages.
#[derive(Debug, Clone)]
struct Pending {
    spec: Arc<ServiceSpec>,
    fields: Vec<String>,
}

/// A validated Service port.
struct PortInfo {
    /// Port name, `""` when unnamed.
    name: String,
    proto: L4Proto,
    port: u16,
    node_port: Option<u16>,
    /// Numeric target port (PORT-05 fallback); `None` when `targetPort` is a name.
    target_number: Option<u16>,
    /// Display name of the port in table names.
    table_name: String,
}

/// An address from the Service spec or status, with the field it came from.
struct SourcedAddr {
    addr: IpAddr,
    field: String,
}

fn svc_err(label: &str, field: impl Into<String>, message: impl Into<String>) -> Issue {
    Issue {
        severity: Severity::Error,
        object: label.to_owned(),
        field: field.into(),
        message: format!("{}; Service not programmed", message.into()),
    }
}

fn parse_proto(s: Option<&str>) -> Option<L4Proto> {
    match s.unwrap_or("TCP") {
        "TCP" => Some(L4Proto::Tcp),
        "UDP" => Some(L4Proto::Udp),
        "SCTP" => Some(L4Proto::Sctp),
        _ => None,
    }
}

fn port_u16(v: i32) -> Option<u16> {
    u16::try_from(v).ok().filter(|&p| p != 0)
}

fn parse_policy(v: Option<&str>) -> Option<Policy> {
    match v.unwrap_or("Cluster") {
        "Cluster" | "" => Some(Policy::Cluster),
        "Local" => Some(Policy::Local),
        _ => None,
    }
}

/// Parses a CIDR as the API server does: host bits are allowed and masked.
fn parse_cidr_lenient(s: &str) -> Option<Cidr> {
    let s = s.trim();
    let (a, l) = s.split_once('/')?;
    let addr: IpAddr = a.parse().ok()?;
    let len: u8 = l.parse().ok()?;
    let masked = match addr {
        IpAddr::V4(v) => {
            if len > 32 {
                return None;
            }
            let m = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            IpAddr::from((u32::from(v) & m).to_be_bytes())
        }
        IpAddr::V6(v) => {
            if len > 128 {
                return None;
            }
            let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            IpAddr::from((u128::from(v) & m).to_be_bytes())
        }
    };
    Some(Cidr { addr: masked, len })
}

/// Translates one Service into pending specs. `Err` = the whole Service is skipped.
fn translate_service(
    svc: &Service,
    slices: &[&EndpointSlice],
    ctx: &Ctx<'_>,
    label: &str,
    report: &mut TranslateReport,
) -> Result<Vec<Pending>, Issue> {
    let meta = &svc.metadata;
    if meta.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME)) {
        return Ok(Vec::new());
    }
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let name = meta.name.as_deref().unwrap_or_default();
    let Some(spec) = svc.spec.as_ref() else {
        return Err(svc_err(label, "spec", "missing"));
    };
    let annotations = meta.annotations.clone().unwrap_or_default();

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
        let Ok(a) = s.trim().parse::<IpAddr>() else {
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
    let etp = parse_policy(spec.external_traffic_policy.as_deref()).ok_or_else(|| {
        svc_err(
            label,
            "spec.externalTrafficPolicy",
            format!("{:?} is not Cluster or Local", spec.external_traffic_policy.as_deref().unwrap_or_default()),
        )
    })?;
    let itp = parse_policy(spec.internal_traffic_policy.as_deref()).ok_or_else(|| {
        svc_err(
            label,
            "spec.internalTrafficPolicy",
            format!("{:?} is not Cluster or Local", spec.internal_traffic_policy.as_deref().unwrap_or_default()),
        )
    })?;

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
                        zone: e.zone.clone(),
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
fn gather_endpoints(
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
        if slice.address_type != fam.name() {
            continue;
        }
        let label = format!(
            "EndpointSlice {}/{}",
            slice.metadata.namespace.as_deref().unwrap_or("default"),
            slice.metadata.name.as_deref().unwrap_or_default()
        );
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
                        object: label,
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
                        object: label,
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
            let addr = match a0.trim().parse::<IpAddr>() {
                Ok(a) if Family::of(a) == fam => a,
                Ok(a) => {
                    report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label.clone(),
                        field: format!("endpoints[{ei}].addresses[0]"),
                        message: format!("{a} is not {} like the slice's addressType; ignored", fam.name()),
                    });
                    continue;
                }
                Err(_) => {
                    report.issues.push(Issue {
                        severity: Severity::Warning,
                        object: label.clone(),
                        field: format!("endpoints[{ei}].addresses[0]"),
                        message: format!("{a0:?} is not an IP address; ignored"),
                    });
                    continue;
                }
            };
            let c = e.conditions.as_ref();
            // EPS-05..07: nil ready/serving = true, nil terminating = false (API docs).
            let ready = publish_not_ready || c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(true);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
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
                zone: e.zone.clone(),
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
