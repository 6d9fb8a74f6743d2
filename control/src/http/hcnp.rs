//! Per-Service `healthCheckNodePort` servers (kube-proxy's `ServiceHealthServer`,
//! `pkg/proxy/healthcheck/service_health.go`; TP-09, HC-06).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, PoisonError, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use crate::cluster::ServiceRef;
use crate::http::{HttpError, ProxyHealth, ServerHandle, json_response, serve_router};

/// One Service that needs a health check server on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckService {
    /// Its `spec.healthCheckNodePort`.
    pub port: u16,
    /// The Service.
    pub service: ServiceRef,
    /// This node's ready endpoints of the Service (see
    /// [`crate::k8s::health_check_services`]).
    pub local_endpoints: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    service: ServiceRef,
    local_endpoints: usize,
}

#[derive(Clone)]
struct PortState {
    entry: Arc<RwLock<Entry>>,
    health: Arc<ProxyHealth>,
}

#[derive(Debug)]
struct PortServer {
    entry: Arc<RwLock<Entry>>,
    handle: ServerHandle,
}

/// Keeps one HTTP listener per `healthCheckNodePort`, answering on every path:
/// - 200 when the Service has at least one local ready endpoint and the sync loop is
///   healthy and not draining ([`ProxyHealth::serving`]; node deletion does not matter, TP-09),
///   else 503;
/// - headers `Content-Type: application/json`, `X-Content-Type-Options: nosniff` and
///   `X-Load-Balancing-Endpoint-Weight: N`;
/// - body `{"service":{"namespace":NS,"name":NAME},"localEndpoints":N,"serviceProxyHealthy":B}`
///   (kube-proxy's fields).
///
/// [`sync`](Self::sync) opens listeners for new ports, updates counts and closes the
/// listeners of ports no longer listed.
pub struct HealthCheckServers {
    bind: IpAddr,
    health: Arc<ProxyHealth>,
    servers: BTreeMap<u16, PortServer>,
}

impl fmt::Debug for HealthCheckServers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthCheckServers").field("bind", &self.bind).field("ports", &self.ports()).finish()
    }
}

impl HealthCheckServers {
    /// Servers listening on `bind` (e.g. `0.0.0.0`, or `::` for both families), with
    /// `health` as the sync loop's health.
    pub fn new(bind: IpAddr, health: Arc<ProxyHealth>) -> Self {
        Self { bind, health, servers: BTreeMap::new() }
    }

    /// The ports with a listener, ascending.
    pub fn ports(&self) -> Vec<u16> {
        self.servers.keys().copied().collect()
    }

    /// The local address of the listener for `port` (its port is `port` unless `port` was 0,
    /// which only tests use).
    pub fn local_addr(&self, port: u16) -> Option<SocketAddr> {
        self.servers.get(&port).map(|s| s.handle.local_addr())
    }

    /// Makes the listeners match `services`. Must run inside a Tokio runtime.
    ///
    /// Returns the problems (a port that cannot be bound, a port listed twice); the other
    /// ports are served regardless, and a port that failed is tried again on the next sync.
    pub async fn sync(&mut self, services: &[HealthCheckService]) -> Vec<HttpError> {
        let mut errors = Vec::new();
        let mut wanted: BTreeMap<u16, &HealthCheckService> = BTreeMap::new();
        for s in services {
            if let Some(first) = wanted.get(&s.port) {
                errors.push(HttpError::DuplicatePort {
                    port: s.port,
                    first: first.service.to_string(),
                    second: s.service.to_string(),
                });
                continue;
            }
            wanted.insert(s.port, s);
        }
        self.servers.retain(|port, _| wanted.contains_key(port));
        for (port, s) in wanted {
            let e = Entry { service: s.service.clone(), local_endpoints: s.local_endpoints };
            if let Some(srv) = self.servers.get(&port) {
                *srv.entry.write().unwrap_or_else(PoisonError::into_inner) = e;
                continue;
            }
            let entry = Arc::new(RwLock::new(e));
            let state = PortState { entry: entry.clone(), health: self.health.clone() };
            let router = Router::new().fallback(answer).with_state(state);
            match serve_router(SocketAddr::new(self.bind, port), router).await {
                Ok(handle) => {
                    tracing::info!(port, service = %s.service, "healthCheckNodePort server started");
                    self.servers.insert(port, PortServer { entry, handle });
                }
                Err(err) => errors.push(err),
            }
        }
        errors
    }
}

async fn answer(State(st): State<PortState>) -> Response {
    let e = st.entry.read().unwrap_or_else(PoisonError::into_inner).clone();
    let healthy = st.health.serving();
    let code = if e.local_endpoints > 0 && healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = serde_json::json!({
        "service": { "namespace": e.service.namespace, "name": e.service.name },
        "localEndpoints": e.local_endpoints,
        "serviceProxyHealthy": healthy,
    });
    let mut r = json_response(code, body.to_string());
    if let Ok(v) = axum::http::HeaderValue::from_str(&e.local_endpoints.to_string()) {
        r.headers_mut().insert("X-Load-Balancing-Endpoint-Weight", v);
    }
    r
}
