//! The cluster state: the Kubernetes objects the tables are built from (Services,
//! EndpointSlices, this node's Node, the host's addresses), as the sources produce them and
//! the translation ([`crate::translate`]) reads them.
//!
//! - [`ClusterState`]: the flat form. The file source ([`crate::file_source`]) gives one,
//!   `xlb check` and [`crate::translate::build_spec`] take one.
//! - [`ClusterIndex`]: the same objects indexed (Services by namespace and name,
//!   EndpointSlices by their Service), kept up to date from watch events by the Kubernetes
//!   source ([`crate::k8s::Source`]) and read by [`crate::translate::Translator::update`].
//! - [`ServiceRef`] names a Service; [`Changes`] says which Services changed between two
//!   states (or that everything did).
//!
//! Nothing here knows where the objects come from or what the tables hold: the sources
//! depend on this module, and so does the translation, but not on each other.

mod changes;
mod index;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use changes::{Changes, ServiceRef, object_changes};
pub use index::ClusterIndex;

/// Label that joins an EndpointSlice to its Service (EPS-01).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

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

/// The order objects are taken in: namespace (`default` when unset, as everywhere in the
/// cluster state and the translation), then name. Services are translated in this order; the
/// Kubernetes source hands its snapshot over sorted by it, so the translation need not sort
/// again.
pub fn object_order(m: &ObjectMeta) -> (&str, &str) {
    (m.namespace.as_deref().unwrap_or("default"), m.name.as_deref().unwrap_or_default())
}

/// Hash map with foldhash (the keys are our own objects' names, not attacker-chosen packets).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
