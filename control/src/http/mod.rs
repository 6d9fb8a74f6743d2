//! HTTP endpoints with kube-proxy's semantics, served by axum on the control plane's Tokio
//! runtime (never on the worker cores):
//! - [`serve_healthz`]: `/healthz` and `/livez` on `healthzBindAddress` (default
//!   `0.0.0.0:10256`, HC-01..05);
//! - [`serve_metrics`]: `/metrics` on `metricsBindAddress` (default `127.0.0.1:10249`, HC-08,
//!   MET-01..05; Prometheus text 0.0.4 or OpenMetrics by `Accept`), plus kube-proxy's
//!   `/healthz` (always `ok`) and `/proxyMode` (`xlb`) there;
//! - [`HealthCheckServers`]: one listener per `healthCheckNodePort` (TP-09).
//!
//! [`Telemetry`] bundles the state they read, which [`crate::k8s::Source`] and the sync loop
//! update.

mod hcnp;
mod health;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use hcnp::{HealthCheckServers, HealthCheckService};
pub use health::{HealthStatus, ProxyHealth, WORKER_STALL_LIMIT, WorkerStallWatch, go_time};
pub use metrics::{
    BackendStats, CountersView, DataplaneView, EndpointCounts, InterfaceStats, InterfaceStatsCell,
    OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE, ProxyMetrics, ServiceStats, WATCHED_RESOURCES, WorkerStats,
    XskStats, openmetrics_to_prometheus,
};

/// Errors of the HTTP servers.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listen address cannot be bound (in use, not local, no permission).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Two Services list the same `healthCheckNodePort`; the first keeps it.
    #[error("healthCheckNodePort {port} of {second} is already used by {first}")]
    DuplicatePort {
        /// The port.
        port: u16,
        /// The Service that has it.
        first: String,
        /// The Service that was refused.
        second: String,
    },
}

/// The health and metrics state shared by the servers, the Kubernetes source and the sync
/// loop.
#[derive(Debug, Clone)]
pub struct Telemetry {
    /// `/healthz`, `/livez` and the healthCheckNodePort servers' view of the sync loop.
    pub health: Arc<ProxyHealth>,
    /// `/metrics`.
    pub metrics: Arc<ProxyMetrics>,
}

impl Telemetry {
    /// Fresh state: health timeout 2 × `sync_period` (HC-02), every metric at zero.
    pub fn new(sync_period: Duration) -> Self {
        Self { health: Arc::new(ProxyHealth::new(sync_period)), metrics: Arc::new(ProxyMetrics::new()) }
    }
}

/// The Kubernetes source's reports go to `/metrics` and the health servers.
impl crate::k8s::SourceObserver for Telemetry {
    fn change_queued(&self, at: std::time::SystemTime) {
        self.metrics.set_last_queued(at);
        self.health.queued_update(at);
    }

    fn service_changed(&self) {
        self.metrics.count_service_changes(1);
    }

    fn endpoints_changed(&self) {
        self.metrics.count_endpoint_changes(1);
    }

    fn node_seen(&self, node: Option<&k8s_openapi::api::core::v1::Node>) {
        self.health.sync_node(node);
    }

    fn watch_error(&self, resource: &'static str) {
        self.metrics.count_watch_error(resource);
    }

    fn published(&self, p: crate::k8s::Published<'_>) {
        self.metrics.observe_sync(p.took);
        self.metrics.set_last_sync(p.at);
        for d in p.programming {
            self.metrics.observe_network_programming(*d);
        }
        self.metrics.set_no_local_endpoints(p.no_local_endpoints);
        self.health.updated(p.at);
        if let Some(q) = p.pending_since {
            self.health.queued_update(q);
        }
    }
}

/// A running server. Dropping it stops the listener at once (open connections finish);
/// [`shutdown`](Self::shutdown) stops it gracefully and waits.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets open requests finish (at most 5 s), then returns.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), t).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Binds `addr` and serves `router` on a new task of the current runtime.
pub(crate) async fn serve_router(addr: SocketAddr, router: Router) -> Result<ServerHandle, HttpError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| HttpError::Bind { addr, source })?;
    let local = listener.local_addr().map_err(|source| HttpError::Bind { addr, source })?;
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let r = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(address = %local, error = %e, "HTTP server stopped");
        }
    });
    Ok(ServerHandle { addr: local, stop: Some(tx), task: Some(task) })
}

/// A response with kube-proxy's JSON headers.
pub(crate) fn json_response(code: StatusCode, body: String) -> Response {
    let mut r = (code, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert("X-Content-Type-Options", HeaderValue::from_static("nosniff"));
    r
}

fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// kube-proxy's `/healthz` body: `{"lastUpdated": "…","currentTime": "…", "nodeEligible": B}`.
pub fn healthz_body(s: &HealthStatus) -> String {
    format!(
        r#"{{"lastUpdated": {},"currentTime": {}, "nodeEligible": {}}}"#,
        quote(&go_time(s.last_updated)),
        quote(&go_time(Some(s.current_time))),
        s.node_eligible
    )
}

/// kube-proxy's `/livez` body: `{"lastUpdated": "…","currentTime": "…"}`.
pub fn livez_body(s: &HealthStatus) -> String {
    format!(
        r#"{{"lastUpdated": {},"currentTime": {}}}"#,
        quote(&go_time(s.last_updated)),
        quote(&go_time(Some(s.current_time)))
    )
}

fn code_of(s: &HealthStatus) -> StatusCode {
    if s.healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

async fn healthz(State(t): State<Telemetry>) -> Response {
    let s = t.health.healthz();
    t.metrics.count_healthz(s.code());
    json_response(code_of(&s), healthz_body(&s))
}

async fn livez(State(t): State<Telemetry>) -> Response {
    let s = t.health.livez();
    t.metrics.count_livez(s.code());
    json_response(code_of(&s), livez_body(&s))
}

/// Serves `/healthz` (200, or 503 when the sync loop is late or the node is being deleted)
/// and `/livez` (the same without the node rule) on `addr` (`healthzBindAddress`). Must run
/// inside a Tokio runtime.
///
/// # Errors
/// [`HttpError::Bind`].
pub async fn serve_healthz(addr: SocketAddr, telemetry: Telemetry) -> Result<ServerHandle, HttpError> {
    let router = Router::new().route("/healthz", get(healthz)).route("/livez", get(livez)).with_state(telemetry);
    serve_router(addr, router).await
}

async fn metrics(State(m): State<Arc<ProxyMetrics>>, headers: HeaderMap) -> Response {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (text, ct) = if openmetrics {
        (m.encode(), OPENMETRICS_CONTENT_TYPE)
    } else {
        (m.encode_prometheus(), PROMETHEUS_CONTENT_TYPE)
    };
    match text {
        Ok(text) => {
            let mut r = (StatusCode::OK, text).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            r
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed\n").into_response(),
    }
}

/// Serves `/metrics`, `/healthz` (`ok`) and `/proxyMode` (`xlb`) on `addr`
/// (`metricsBindAddress`). `/metrics` answers in the Prometheus text format 0.0.4
/// ([`ProxyMetrics::encode_prometheus`], like kube-proxy), or in OpenMetrics text
/// ([`ProxyMetrics::encode`]) when the scraper's `Accept` asks for
/// `application/openmetrics-text` (Prometheus does by default). Must run inside a Tokio
/// runtime.
///
/// # Errors
/// [`HttpError::Bind`].
pub async fn serve_metrics(addr: SocketAddr, metrics_state: Arc<ProxyMetrics>) -> Result<ServerHandle, HttpError> {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/proxyMode", get(|| async { "xlb" }))
        .with_state(metrics_state);
    serve_router(addr, router).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn go_time_format() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 120_000_000);
        assert_eq!(go_time(Some(t)), "2023-11-14 22:13:20.12 +0000 UTC");
        assert_eq!(go_time(Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))), "2023-11-14 22:13:20 +0000 UTC");
        assert_eq!(go_time(None), "0001-01-01 00:00:00 +0000 UTC");
    }

    #[test]
    fn hc_02_health_times_out_after_twice_sync_period() {
        let timeout = Duration::from_secs(60);
        let h = ProxyHealth::new(timeout / 2);
        assert_eq!(h.timeout(), timeout);
        // Times are given, not waited for: `t0` is at least the health's creation.
        let t0 = SystemTime::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(h.healthz_at(at(59)).healthy, "healthy while starting");
        assert!(!h.healthz_at(at(61)).healthy, "never synced: stale a timeout after the start");
        h.updated(at(100));
        assert!(h.healthz_at(at(159)).healthy && h.livez_at(at(159)).healthy);
        assert!(!h.healthz_at(at(161)).healthy, "no sync for longer than the timeout");
        assert!(!h.livez_at(at(161)).healthy);
        h.updated(at(161));
        assert!(h.livez_at(at(162)).healthy);
        // A change queued long ago and not synced since (kube-proxy's rule), while the last
        // sync is recent.
        h.queued_update(at(150));
        assert!(h.healthz_at(at(209)).healthy, "pending for less than the timeout");
        assert!(!h.healthz_at(at(211)).healthy, "pending for longer than the timeout");
        assert!(!h.livez_at(at(211)).healthy);
        h.updated(at(211));
        assert!(h.healthz_at(at(212)).healthy);
    }

    #[test]
    fn hc_03_hc_04_node_deletion_fails_healthz_not_livez() {
        use k8s_openapi::api::core::v1::Node;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
        let h = ProxyHealth::new(Duration::from_secs(30));
        h.updated(SystemTime::now());
        let mut n =
            Node { metadata: ObjectMeta { name: Some("n".into()), ..Default::default() }, ..Default::default() };
        h.sync_node(Some(&n));
        assert!(h.healthz().healthy);
        n.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        h.sync_node(Some(&n));
        let s = h.healthz();
        assert!(!s.healthy && !s.node_eligible);
        assert!(healthz_body(&s).contains(r#""nodeEligible": false"#), "{}", healthz_body(&s));
        assert!(h.livez().healthy);
        h.sync_node(None);
        assert!(!h.healthz().healthy);
    }

    #[test]
    fn tp_09_node_deletion_does_not_fail_health_check_node_ports() {
        use k8s_openapi::api::core::v1::Node;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
        let h = ProxyHealth::new(Duration::from_secs(30));
        h.updated(SystemTime::now());
        let mut n =
            Node { metadata: ObjectMeta { name: Some("n".into()), ..Default::default() }, ..Default::default() };
        n.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        h.sync_node(Some(&n));
        assert!(!h.healthz().healthy, "/healthz fails while the node is deleted");
        assert!(h.serving(), "healthCheckNodePorts keep answering from the endpoints (kube-proxy's rule)");
        h.sync_node(None);
        assert!(h.serving(), "and after the Node is gone");
    }

    #[test]
    fn a_stalled_worker_fails_livez_healthz_and_health_check_node_ports_until_it_moves_again() {
        let h = ProxyHealth::new(Duration::from_secs(30));
        h.updated(SystemTime::now());
        assert!(h.livez().healthy && h.healthz().healthy && h.serving());
        h.set_stalled_workers(vec![1]);
        assert_eq!(h.stalled_workers(), [1]);
        assert_eq!((h.livez().code(), h.healthz().code()), (503, 503));
        assert!(!h.serving());
        h.set_stalled_workers(vec![]);
        assert!(h.livez().healthy && h.healthz().healthy && h.serving());
    }

    #[test]
    fn a_worker_is_stalled_once_its_heartbeat_stands_still_for_longer_than_the_limit() {
        use dataplane::counters::WorkerCounters;
        let (a, b) = (Arc::new(WorkerCounters::new(1, 1)), Arc::new(WorkerCounters::new(1, 1)));
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = WorkerStallWatch::new(vec![(0, a.clone()), (1, b.clone())], Duration::from_secs(5), t0);
        // Worker 0 beats every second; worker 1 beats once, then stops.
        for s in 1..=5u64 {
            a.heartbeat_ms.set(s * 1000);
            if s == 1 {
                b.heartbeat_ms.set(1000);
            }
            assert!(w.stalled(at(s * 1000)).is_empty(), "second {s}");
        }
        a.heartbeat_ms.set(6000);
        assert!(w.stalled(at(6000)).is_empty(), "worker 1's beat stood still for exactly the limit");
        a.heartbeat_ms.set(6100);
        assert_eq!(w.stalled(at(6100)), [1], "longer than the limit");
        // Worker 1 moves again; worker 0, its heartbeat standing still from now on, stalls in
        // turn.
        b.heartbeat_ms.set(7000);
        assert!(w.stalled(at(7000)).is_empty());
        for ms in [8000, 9000, 10_000, 11_000] {
            assert!(w.stalled(at(ms)).is_empty(), "{ms} ms");
        }
        assert_eq!(w.stalled(at(11_101)), [0], "worker 0's last beat was read at 6.1 s");
        assert_eq!(w.stalled(at(12_001)), [0, 1], "worker 1's at 7 s");
        // A worker that never beats is stalled the limit after the watch began.
        let c = Arc::new(WorkerCounters::new(1, 1));
        let mut w = WorkerStallWatch::new(vec![(2, c)], Duration::from_secs(5), t0);
        for ms in [1000, 2000, 3000, 4000, 5000] {
            assert!(w.stalled(at(ms)).is_empty(), "{ms} ms");
        }
        assert_eq!(w.stalled(at(5001)), [2]);
        // The caller itself did not run for longer than the check gap (the process stopped):
        // nothing is judged from the time it missed.
        assert!(w.stalled(at(20_000)).is_empty(), "after a gap, judged afresh");
        for ms in [21_000, 22_000, 23_000, 24_000, 25_000] {
            assert!(w.stalled(at(ms)).is_empty(), "{ms} ms");
        }
        assert_eq!(w.stalled(at(25_001)), [2]);
    }

    #[test]
    fn lb_06_draining_fails_healthz_and_health_check_node_ports_not_livez() {
        let h = ProxyHealth::new(Duration::from_secs(30));
        h.updated(SystemTime::now());
        assert!(h.healthz().healthy && h.serving() && !h.is_draining());
        h.begin_drain();
        assert!(h.is_draining());
        assert_eq!(h.healthz().code(), 503, "/healthz fails at once");
        assert!(h.healthz().node_eligible, "the node itself is still eligible");
        assert!(!h.serving(), "healthCheckNodePorts fail at once");
        assert!(h.livez().healthy, "/livez stays 200: the process is alive and forwarding");
    }
}
