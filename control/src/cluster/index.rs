//! [`ClusterIndex`]: the Kubernetes objects kept indexed, so a change costs O(log n) to apply
//! and a Service's objects are found without walking every object.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{ClusterState, FastMap, ServiceRef, object_order};

/// The objects a table is built from, indexed: Services by (namespace, name), EndpointSlices
/// grouped by (namespace, `kubernetes.io/service-name` label) and by slice name within a
/// group (EPS-01). The Kubernetes source keeps one up to date from the watch events
/// ([`crate::k8s::Snapshot::cluster`]); [`crate::translate::Translator::update`] reads it.
///
/// Unlike [`ClusterState`], there is at most one object per (namespace, name) (as in the API
/// server); a missing namespace counts as `default`, a missing name as `""`. Objects are
/// shared (`Arc`), as in the watch caches.
#[derive(Debug, Clone, Default)]
pub struct ClusterIndex {
    services: BTreeMap<ServiceRef, Arc<Service>>,
    /// Slices with a (non-empty) service-name label: by their Service, then by slice name.
    groups: FastMap<ServiceRef, BTreeMap<String, Arc<EndpointSlice>>>,
    /// Every slice by (namespace, name): the Service it is grouped under (`None`: no label,
    /// kept in `unlabelled`).
    slice_owner: FastMap<(String, String), Option<ServiceRef>>,
    /// Slices without the service-name label (used by nothing, kept for [`Self::to_state`]).
    unlabelled: BTreeMap<(String, String), Arc<EndpointSlice>>,
    /// This node's own Node object, if known (addresses, zone label).
    pub node: Option<Node>,
}

/// (namespace, name) of an object as the index keys it.
fn slice_key(s: &EndpointSlice) -> (String, String) {
    let (ns, name) = object_order(&s.metadata);
    (ns.to_owned(), name.to_owned())
}

impl ClusterIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index of a flat state's objects (a later object with the same (namespace, name) as
    /// an earlier one replaces it). `local_addresses` are not part of the index.
    pub fn from_state(state: &ClusterState) -> Self {
        let mut ix = Self { node: state.node.clone(), ..Self::default() };
        for s in &state.services {
            ix.set_service(Arc::clone(s));
        }
        for s in &state.endpoint_slices {
            ix.set_slice(Arc::clone(s));
        }
        ix
    }

    /// The flat form (Services and slices sorted by [`object_order`]), with
    /// `local_addresses`, for [`crate::translate::build_spec`] and the other users of
    /// [`ClusterState`]. O(objects): shares the objects, copies the pointers.
    pub fn to_state(&self, local_addresses: &[IpAddr]) -> ClusterState {
        let mut slices: Vec<Arc<EndpointSlice>> =
            self.groups.values().flat_map(BTreeMap::values).chain(self.unlabelled.values()).cloned().collect();
        slices.sort_by(|a, b| object_order(&a.metadata).cmp(&object_order(&b.metadata)));
        ClusterState {
            services: self.services.values().cloned().collect(),
            endpoint_slices: slices,
            node: self.node.clone(),
            local_addresses: local_addresses.to_vec(),
        }
    }

    /// Adds or replaces a Service; returns its key.
    pub fn set_service(&mut self, s: Arc<Service>) -> ServiceRef {
        let r = ServiceRef::of_service(&s);
        self.services.insert(r.clone(), s);
        r
    }

    /// Removes a Service (its slices stay: they still name it). Whether it was there.
    pub fn remove_service(&mut self, r: &ServiceRef) -> bool {
        self.services.remove(r).is_some()
    }

    /// Adds or replaces an EndpointSlice. Returns the Services whose slices changed: the one
    /// its label names now, and the one it was grouped under before when that differs (a
    /// slice that moved or lost its label); zero, one or two.
    pub fn set_slice(&mut self, s: Arc<EndpointSlice>) -> Vec<ServiceRef> {
        let key = slice_key(&s);
        let new_owner = ServiceRef::of_slice(&s);
        let mut touched = Vec::new();
        if let Some(old) = self.detach(&key)
            && new_owner.as_ref() != Some(&old)
        {
            touched.push(old);
        }
        match &new_owner {
            Some(r) => {
                self.groups.entry(r.clone()).or_default().insert(key.1.clone(), s);
                touched.push(r.clone());
            }
            None => {
                self.unlabelled.insert(key.clone(), s);
            }
        }
        self.slice_owner.insert(key, new_owner);
        touched
    }

    /// Removes the EndpointSlice `namespace/name`; returns the Service it was grouped under,
    /// if any (whose slices changed).
    pub fn remove_slice(&mut self, namespace: &str, name: &str) -> Option<ServiceRef> {
        let key = (namespace.to_owned(), name.to_owned());
        let old = self.detach(&key);
        self.slice_owner.remove(&key);
        old
    }

    /// Takes the slice `key` out of its group (or the unlabelled set); its old Service.
    fn detach(&mut self, key: &(String, String)) -> Option<ServiceRef> {
        match self.slice_owner.get(key)? {
            Some(r) => {
                let r = r.clone();
                if let Some(g) = self.groups.get_mut(&r) {
                    g.remove(&key.1);
                    if g.is_empty() {
                        self.groups.remove(&r);
                    }
                }
                Some(r)
            }
            None => {
                self.unlabelled.remove(key);
                None
            }
        }
    }

    /// The Service `r`, if present.
    pub fn service(&self, r: &ServiceRef) -> Option<&Arc<Service>> {
        self.services.get(r)
    }

    /// Every Service, in (namespace, name) order.
    pub fn services(&self) -> impl Iterator<Item = (&ServiceRef, &Arc<Service>)> {
        self.services.iter()
    }

    /// The EndpointSlices whose label names Service `r` (whether or not the Service exists), in
    /// slice-name order.
    pub fn slices_of(&self, r: &ServiceRef) -> impl Iterator<Item = &Arc<EndpointSlice>> {
        self.groups.get(r).into_iter().flat_map(BTreeMap::values)
    }

    /// Number of Services.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Number of EndpointSlices (with or without label).
    pub fn slice_count(&self) -> usize {
        self.slice_owner.len()
    }
}
