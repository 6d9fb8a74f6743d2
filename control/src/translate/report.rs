//! What a translation reports besides the tables: problems by object and field, the MET-04
//! counts, and the one error that stops it (an invalid configuration).

use std::fmt;

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

/// What [`build_spec`](super::build_spec) noticed besides the tables.
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
    /// A config field is invalid (see [`Config::validate`](crate::config::Config::validate)).
    #[error("invalid configuration, field {field}: {message}")]
    Config {
        /// Field path in the xlb configuration document.
        field: String,
        /// What is wrong.
        message: String,
    },
}
