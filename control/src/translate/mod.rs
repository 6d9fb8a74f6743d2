//! Translation of Kubernetes objects into dataplane tables: the one pure function
//! [`build_spec`], shared by `xlb run --config` (standalone) and the Kubernetes source. The
//! objects come as the cluster state of [`crate::cluster`] (flat, or indexed for
//! [`Translator::update`]).
//!
//! # What becomes what
//! Each Service port (PORT-02) and each address family of the Service's `spec.clusterIPs`
//! (DS-01) gives one [`ServiceSpec`](dataplane::tables::ServiceSpec) named
//! `namespace/name:port` (the port's name, or its number when unnamed), with `/ipv4` or
//! `/ipv6` appended for the second family of a dual-stack Service. Its frontends, keyed by
//! (IP, protocol, port) (PORT-03):
//! - the cluster IP of that family (SVC-01; "internal" traffic);
//! - "external" traffic (TP-03): one NodePort frontend per selected node address of that
//!   family (SVC-02, SVC-05, NPA-01..07), each `spec.externalIPs[]` (SVC-11), and each
//!   `status.loadBalancer.ingress[].ip` of a LoadBalancer Service, whatever its
//!   `loadBalancerClass` (SVC-06, SVC-08: the class picks who provisions and announces the
//!   address, not who forwards to it; kube-proxy's `pkg/proxy/serviceport.go`).
//!
//! Services and EndpointSlices labelled [`LABEL_SERVICE_PROXY_NAME`] (handed to another proxy)
//! or [`LABEL_HEADLESS`] are ignored, as kube-proxy's informers never see them.
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

mod assemble;
mod fields;
mod incremental;
mod node;
mod report;
mod select;
mod service;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use dataplane::tables::TablesSpec;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cluster::ClusterState;
use crate::config::Config;
use assemble::{assemble, frontend_taken, globals, maglev_overflow, name_taken, needs_snat, snat_missing};
pub(crate) use fields::{conditions_of, parse_ip};
pub use incremental::{HostFacts, UpdateStats};
use node::{Family, NodeInfo};
pub use report::{Issue, NoLocalEndpoints, Severity, TranslateError, TranslateReport};
use service::{Ctx, Pending, translate_service};

/// Label that hands a Service (and its EndpointSlices) to another proxy; kube-proxy ignores
/// objects carrying it, so do we.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label the Kubernetes controllers put on headless Services' EndpointSlices (and that may be
/// put on a Service); kube-proxy ignores objects carrying it, so do we.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
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

/// Whether xlb proxies a Service or an EndpointSlice with this metadata: not when it carries
/// [`LABEL_SERVICE_PROXY_NAME`] or [`LABEL_HEADLESS`] (whatever the value), the objects
/// kube-proxy's informers leave out (label selector
/// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`,
/// `cmd/kube-proxy/app/server.go`). The translation and the health check servers
/// ([`crate::k8s::health_check_services`]) both go by it.
pub(crate) fn proxied(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_none_or(|l| !l.contains_key(LABEL_SERVICE_PROXY_NAME) && !l.contains_key(LABEL_HEADLESS))
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

/// The objects a translation cached by [`Translator::build`] was made from: the Service and
/// its EndpointSlices (in name order), kept shared so that they are compared by address.
#[derive(Debug, Clone)]
struct Made {
    service: Arc<Service>,
    slices: Vec<Arc<EndpointSlice>>,
}

impl Made {
    /// `None` when an object has no resourceVersion (objects from a file): such a Service is
    /// translated every time.
    fn of(svc: &Arc<Service>, slices: &[&Arc<EndpointSlice>]) -> Option<Self> {
        if svc.metadata.resource_version.is_none() || slices.iter().any(|s| s.metadata.resource_version.is_none()) {
            return None;
        }
        Some(Self { service: Arc::clone(svc), slices: slices.iter().map(|s| Arc::clone(s)).collect() })
    }

    /// Whether `svc` and `slices` are these very objects (the same `Arc`s), without
    /// allocating. Equal resourceVersions alone prove nothing here: an object of a config file
    /// keeps the one `kubectl get -o yaml` printed through any hand edit.
    fn matches(&self, svc: &Arc<Service>, slices: &[&Arc<EndpointSlice>]) -> bool {
        Arc::ptr_eq(&self.service, svc)
            && self.slices.len() == slices.len()
            && self.slices.iter().zip(slices).all(|(a, b)| Arc::ptr_eq(a, b))
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
/// [`Translator::build`] reuses a cached translation when the Service and its EndpointSlices
/// are the very objects it was made from (the same `Arc`s, as a kept [`ClusterState`] or the
/// Kubernetes source's snapshots share them; a reloaded file's objects are new ones), and the
/// xlb configuration, this node's Node object and the host's addresses
/// ([`ClusterState::local_addresses`], where NodePorts answer) are equal to the previous
/// build's (any change of those translates everything). This needs no list of changes from the
/// watcher, and a slice that moves to another Service changes both Services' slice lists.
/// Objects without a resourceVersion (from a file) are always translated. [`Translator::update`]
/// goes by resourceVersions instead (the API server changes one on every write). The result
/// is always equal to [`build_spec`]'s for the same input (pinned by a test); only the time
/// differs.
///
/// Two independent ways in: [`Translator::build`] walks a flat [`ClusterState`] every time
/// (the file source, SIGHUP reloads, `xlb check`), and [`Translator::update`] keeps the whole
/// translation ([`Translator::spec`], [`Translator::report`]) and applies a change set from
/// an indexed [`ClusterIndex`](crate::cluster::ClusterIndex) in O(changed Services) (the Kubernetes source).
#[derive(Debug, Default)]
pub struct Translator {
    /// Config, Node and host addresses ([`ClusterState::local_addresses`]) the cache was made
    /// with.
    basis: Option<(Config, Option<Node>, Vec<IpAddr>)>,
    /// By (namespace, name): the objects a translation was made from, and the translation.
    cache: FastMap<(String, String), (Made, Cached)>,
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
        if self.basis.as_ref().is_none_or(|(c, n, local)| {
            c != cfg || n.as_ref() != input.node.as_ref() || *local != input.local_addresses
        }) {
            self.cache.clear();
            self.basis = Some((cfg.clone(), input.node.clone(), input.local_addresses.clone()));
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

/// Services a translation thread claims at a time (one atomic add per claim).
pub const TRANSLATE_PER_CLAIM: usize = 64;

/// A build uses another translation thread only for every this many Services to translate
/// (a Service of 10 endpoints takes a few microseconds; a thread tens to start).
pub const TRANSLATE_PER_THREAD: usize = 512;

/// `(0..n).map(f)` on up to `threads` threads (the calling thread is one), in index order,
/// claiming [`TRANSLATE_PER_CLAIM`] indices at a time, and another thread only for every
/// [`TRANSLATE_PER_THREAD`] Services ([`dataplane::par::par_map`]: a helper that cannot be
/// started or that panicked leaves its indices to the calling thread, so the result is always
/// complete and equal to the one-thread result).
fn par_map<T: Send>(n: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = threads.min(n / TRANSLATE_PER_THREAD).max(1);
    dataplane::par::par_map(n, threads, TRANSLATE_PER_CLAIM, "xlb-translate", || (), |(), i| f(i)).0
}
