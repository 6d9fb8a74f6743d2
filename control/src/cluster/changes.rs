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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::LABEL_SERVICE_NAME;

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
}

/// Objects added, changed or removed between two sets, matched by namespace and name (what a
/// watch would have reported as add, update and delete events): kube-proxy's change counts for
/// a config file reload (`kubeproxy_sync_proxy_rules_service_changes_total`,
/// `..._endpoint_changes_total`).
pub fn object_changes<T: k8s_openapi::Metadata<Ty = ObjectMeta> + PartialEq>(
    old: &[std::sync::Arc<T>],
    new: &[std::sync::Arc<T>],
) -> u64 {
    use std::collections::BTreeMap;
    let key = |o: &std::sync::Arc<T>| {
        let m = o.metadata();
        (m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default())
    };
    let before: BTreeMap<_, _> = old.iter().map(|o| (key(o), o)).collect();
    let after: BTreeMap<_, _> = new.iter().map(|o| (key(o), o)).collect();
    let changed_or_added = after.iter().filter(|(k, o)| before.get(*k).is_none_or(|b| b != *o)).count();
    let removed = before.keys().filter(|k| !after.contains_key(*k)).count();
    (changed_or_added + removed) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn object_changes_count_adds_updates_and_deletes() {
        let a = [slice("a", "x", Some("web")), slice("a", "y", Some("web")), slice("b", "x", Some("db"))];
        assert_eq!(object_changes(&a, &a), 0);
        let mut changed = slice("a", "y", Some("web"));
        Arc::make_mut(&mut changed).address_type = "IPv6".into();
        // a/y changed, b/x removed, c/z added; a/x the same.
        let b = [slice("a", "x", Some("web")), changed, slice("c", "z", None)];
        assert_eq!(object_changes(&a, &b), 3);
        assert_eq!(object_changes(&[], &b), 3);
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
    fn changes_merge_into_full_which_touches_everything() {
        let mut c = Changes::default();
        assert!(c.is_empty());
        c.add(ServiceRef::new("a", "web"));
        assert!(!c.is_empty() && !c.is_full());
        assert!(c.touches(&ServiceRef::new("a", "web")));
        assert!(!c.touches(&ServiceRef::new("b", "web")));
        c.merge(Changes::Full);
        assert!(c.is_full());
        assert!(c.touches(&ServiceRef::new("z", "z")));
    }
}
