//! Which Services a change touches (SYNC-03, SYNC-07).
//!
//! A Service change touches that Service; an EndpointSlice change touches the Service named
//! by its `kubernetes.io/service-name` label in the slice's namespace (EPS-01; a slice without
//! the label belongs to no Service and touches nothing); a change of this node's addresses or
//! labels, or a relist, touches everything ([`Changes::Full`]).

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::translate::{ClusterState, LABEL_SERVICE_NAME};

/// A Service by namespace and name (kube-proxy's `types.NamespacedName`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRef {
    /// Namespace (`default` when the object has none, as [`crate::translate::build_spec`]
    /// assumes).
    pub namespace: String,
    /// Service name.
    pub name: String,
}

impl ServiceRef {
    /// A reference from namespace and name.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// The Service itself.
    pub fn of_service(s: &Service) -> Self {
        Self::new(s.metadata.namespace.as_deref().unwrap_or("default"), s.metadata.name.as_deref().unwrap_or_default())
    }

    /// The Service an EndpointSlice belongs to, through its `kubernetes.io/service-name`
    /// label (EPS-01); `None` when the label is missing or empty.
    pub fn of_slice(s: &EndpointSlice) -> Option<Self> {
        let svc = s.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
        if svc.is_empty() {
            return None;
        }
        Some(Self::new(s.metadata.namespace.as_deref().unwrap_or("default"), svc.as_str()))
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What changed since the previous snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// Everything must be rebuilt: the first snapshot, a relist (objects may have been
    /// deleted while the watch was down, and a relist does not say which), a change of this
    /// node's addresses or labels, a periodic resync (SYNC-04), or a retry after a failed
    /// sync.
    Full,
    /// Only these Services (their ports, endpoints, frontends) changed. A Service that was
    /// deleted is in the set too: rebuilding it means removing it.
    Services(BTreeSet<ServiceRef>),
}

impl Default for Changes {
    fn default() -> Self {
        Self::Services(BTreeSet::new())
    }
}

impl Changes {
    /// No change at all.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Services(s) if s.is_empty())
    }

    /// Whether everything must be rebuilt.
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full)
    }

    /// Whether `svc` must be rebuilt.
    pub fn touches(&self, svc: &ServiceRef) -> bool {
        match self {
            Self::Full => true,
            Self::Services(s) => s.contains(svc),
        }
    }

    /// Adds one Service.
    pub fn add(&mut self, svc: ServiceRef) {
        if let Self::Services(s) = self {
            s.insert(svc);
        }
    }

    /// Marks everything changed.
    pub fn set_full(&mut self) {
        *self = Self::Full;
    }

    /// Adds everything `other` touches.
    pub fn merge(&mut self, other: Self) {
        match other {
            Self::Full => self.set_full(),
            Self::Services(o) => {
                if let Self::Services(s) = self {
                    s.extend(o);
                }
            }
        }
    }

    /// The part of `state` a partial rebuild needs: the touched Services, the EndpointSlices
    /// that belong to them, and the Node. `None` for [`Changes::Full`] (use all of `state`).
    ///
    /// Feeding this to [`crate::translate::build_spec`] gives the new `ServiceSpec`s of the
    /// touched Services (a touched Service that is absent from `state` was deleted: drop its
    /// specs). See [the module docs of `xlb::k8s`](crate::k8s) for how to splice them into the
    /// previous table and when a full rebuild is still needed.
    pub fn restrict(&self, state: &ClusterState) -> Option<ClusterState> {
        let Self::Services(set) = self else { return None };
        Some(ClusterState {
            services: state.services.iter().filter(|s| set.contains(&ServiceRef::of_service(s))).cloned().collect(),
            endpoint_slices: state
                .endpoint_slices
                .iter()
                .filter(|s| ServiceRef::of_slice(s).is_some_and(|r| set.contains(&r)))
                .cloned()
                .collect(),
            node: state.node.clone(),
        })
    }
}

/// Which Services the difference between two object lists touches: every Service present in
/// only one of them or different between them, and every Service whose EndpointSlices differ
/// (compared by namespace/name and content, `metadata.resourceVersion` and `managedFields`
/// included). Use it to turn a [`Changes::Full`] caused by a relist back into a partial one
/// when the caller kept the previous state.
pub fn diff_states(old: &ClusterState, new: &ClusterState) -> Changes {
    use std::collections::BTreeMap;
    fn key(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
        (m.namespace.clone().unwrap_or_else(|| "default".to_owned()), m.name.clone().unwrap_or_default())
    }
    let node_same = match (&old.node, &new.node) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.metadata.labels == b.metadata.labels
                && a.status.as_ref().and_then(|s| s.addresses.as_ref())
                    == b.status.as_ref().and_then(|s| s.addresses.as_ref())
        }
        _ => false,
    };
    if !node_same {
        return Changes::Full;
    }
    let mut out = BTreeSet::new();
    let o: BTreeMap<_, _> = old.services.iter().map(|s| (key(&s.metadata), s)).collect();
    let n: BTreeMap<_, _> = new.services.iter().map(|s| (key(&s.metadata), s)).collect();
    for (k, s) in &o {
        if n.get(k) != Some(s) {
            out.insert(ServiceRef::new(&k.0, &k.1));
        }
    }
    for k in n.keys() {
        if !o.contains_key(k) {
            out.insert(ServiceRef::new(&k.0, &k.1));
        }
    }
    let o: BTreeMap<_, _> = old.endpoint_slices.iter().map(|s| (key(&s.metadata), s)).collect();
    let n: BTreeMap<_, _> = new.endpoint_slices.iter().map(|s| (key(&s.metadata), s)).collect();
    for (k, s) in &o {
        if n.get(k) != Some(s) {
            out.extend(ServiceRef::of_slice(s));
            out.extend(n.get(k).and_then(|s| ServiceRef::of_slice(s)));
        }
    }
    for (k, s) in &n {
        if !o.contains_key(k) {
            out.extend(ServiceRef::of_slice(s));
        }
    }
    Changes::Services(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::sync::Arc;

    fn svc(ns: &str, name: &str) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta { namespace: Some(ns.into()), name: Some(name.into()), ..Default::default() },
            ..Default::default()
        })
    }

    fn slice(ns: &str, name: &str, svc: Option<&str>) -> Arc<EndpointSlice> {
        Arc::new(EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: svc.map(|s| [(LABEL_SERVICE_NAME.to_owned(), s.to_owned())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: vec![],
            ports: None,
        })
    }

    #[test]
    fn slices_map_to_their_service_by_label() {
        assert_eq!(ServiceRef::of_slice(&slice("a", "web-x1", Some("web"))), Some(ServiceRef::new("a", "web")));
        assert_eq!(ServiceRef::of_slice(&slice("a", "web-x1", None)), None);
        assert_eq!(ServiceRef::of_slice(&slice("a", "web-x1", Some(""))), None);
    }

    #[test]
    fn restrict_keeps_touched_services_and_their_slices() {
        let state = ClusterState {
            services: vec![svc("a", "web"), svc("a", "db"), svc("b", "web")],
            endpoint_slices: vec![
                slice("a", "web-1", Some("web")),
                slice("b", "web-1", Some("web")),
                slice("a", "x", None),
            ],
            node: None,
        };
        let mut c = Changes::default();
        assert!(c.is_empty());
        c.add(ServiceRef::new("a", "web"));
        let r = c.restrict(&state).unwrap();
        assert_eq!(r.services.len(), 1);
        assert_eq!(r.endpoint_slices.len(), 1);
        assert_eq!(r.endpoint_slices[0].metadata.namespace.as_deref(), Some("a"));
        c.merge(Changes::Full);
        assert!(c.restrict(&state).is_none());
        assert!(c.touches(&ServiceRef::new("z", "z")));
    }

    #[test]
    fn diff_names_changed_added_removed_services() {
        let old = ClusterState {
            services: vec![svc("a", "web"), svc("a", "db")],
            endpoint_slices: vec![slice("a", "web-1", Some("web")), slice("a", "db-1", Some("db"))],
            node: None,
        };
        let mut new = old.clone();
        new.services.retain(|s| s.metadata.name.as_deref() != Some("db"));
        new.endpoint_slices.retain(|s| s.metadata.name.as_deref() != Some("db-1"));
        new.endpoint_slices.push(slice("a", "cache-1", Some("cache")));
        let Changes::Services(set) = diff_states(&old, &new) else { panic!("partial expected") };
        assert_eq!(
            set.into_iter().collect::<Vec<_>>(),
            vec![ServiceRef::new("a", "cache"), ServiceRef::new("a", "db")]
        );
    }
}
