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

use crate::translate::LABEL_SERVICE_NAME;

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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::sync::Arc;

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
