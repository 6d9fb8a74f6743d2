//! kube-proxy's proxier health state (`pkg/proxy/healthcheck/proxy_health.go`,
//! `ProxyHealthServer`): HC-02..04, SYNC-05.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use dataplane::counters::WorkerCounters;
use k8s_openapi::api::core::v1::Node;

/// What `/healthz` or `/livez` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthStatus {
    /// 200 (`true`) or 503.
    pub healthy: bool,
    /// kube-proxy's `lastUpdated`: the current time when healthy (kept for compatibility
    /// with old clients, as kube-proxy does), else the last successful sync (`None` = never).
    pub last_updated: Option<SystemTime>,
    /// When the answer was computed.
    pub current_time: SystemTime,
    /// Whether the Node is eligible (no `deletionTimestamp`); always `true` for `/livez`.
    pub node_eligible: bool,
}

impl HealthStatus {
    /// The HTTP status code: 200 or 503.
    pub fn code(&self) -> u16 {
        if self.healthy { 200 } else { 503 }
    }
}

#[derive(Debug)]
struct Inner {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<SystemTime>,
    node_eligible: bool,
    node_seen: bool,
    draining: bool,
    /// Workers whose loop stands still ([`WorkerStallWatch`]), in worker order.
    stalled_workers: Vec<u16>,
}

/// Health of the sync loop and eligibility of the node.
///
/// The proxy is healthy unless (SYNC-05, HC-02):
/// - the last successful sync (or, before the first, the creation of this object) is older
///   than the health timeout, 2 × `syncPeriod`: syncs run at least every `syncPeriod`, so a
///   missing one means the loop is stuck; or
/// - a change has been queued and not synced for the health timeout (kube-proxy's rule:
///   `QueuedUpdate` … `Updated`); or
/// - a worker's loop has stood still for [`WORKER_STALL_LIMIT`] ([`WorkerStallWatch`]; xlb's
///   own rule: the tables may be fresh while a queue's frames go nowhere, and the
///   DaemonSet's liveness probe on `/livez` then restarts the pod, its readiness probe and
///   the VIP announcements on `/healthz` take the node out).
///
/// `/healthz` is additionally 503 while the Node has a `deletionTimestamp` or was deleted
/// (HC-03), and from the moment xlb starts draining on SIGTERM ([`ProxyHealth::begin_drain`],
/// LB-06), as are the healthCheckNodePorts ([`ProxyHealth::serving`]); `/livez` ignores both
/// (HC-04).
#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    created: SystemTime,
    inner: Mutex<Inner>,
}

impl ProxyHealth {
    /// Health with the timeout 2 × `sync_period` (HC-02).
    pub fn new(sync_period: Duration) -> Self {
        Self::with_timeout(sync_period.saturating_mul(2))
    }

    /// Health with an explicit timeout.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            timeout,
            created: SystemTime::now(),
            inner: Mutex::new(Inner {
                last_updated: None,
                oldest_pending: None,
                node_eligible: true,
                node_seen: false,
                draining: false,
                stalled_workers: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The health timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A change was queued at `at` (kept only if no older one is pending).
    pub fn queued_update(&self, at: SystemTime) {
        let mut i = self.lock();
        if i.oldest_pending.is_none_or(|p| at < p) {
            i.oldest_pending = Some(at);
        }
    }

    /// The tables were synced successfully at `at`; nothing is pending any more.
    pub fn updated(&self, at: SystemTime) {
        let mut i = self.lock();
        i.oldest_pending = None;
        i.last_updated = Some(i.last_updated.map_or(at, |l| l.max(at)));
    }

    /// Updates node eligibility from this node's Node object: eligible unless it has a
    /// `deletionTimestamp`; a missing Node (never created, or deleted) is not eligible once
    /// it has been seen, and eligible before (kube-proxy starts eligible).
    pub fn sync_node(&self, node: Option<&Node>) {
        let mut i = self.lock();
        match node {
            Some(n) => {
                i.node_seen = true;
                i.node_eligible = n.metadata.deletion_timestamp.is_none();
            }
            // kube-proxy's OnNodeDelete marks the node not eligible.
            None if i.node_seen => i.node_eligible = false,
            None => {}
        }
    }

    /// Sets the workers whose loop stands still (empty: none), as [`WorkerStallWatch::stalled`]
    /// found them: while any is, `/livez` and `/healthz` answer 503.
    pub fn set_stalled_workers(&self, workers: Vec<u16>) {
        self.lock().stalled_workers = workers;
    }

    /// The workers last set stalled ([`ProxyHealth::set_stalled_workers`]).
    pub fn stalled_workers(&self) -> Vec<u16> {
        self.lock().stalled_workers.clone()
    }

    /// Whether the node is eligible (`nodeEligible`).
    pub fn node_eligible(&self) -> bool {
        self.lock().node_eligible
    }

    /// The sync loop's health alone (`/livez`).
    pub fn is_healthy(&self) -> bool {
        self.proxy_health(SystemTime::now()).0
    }

    /// xlb is shutting down (SIGTERM) and wants load balancers to stop sending it new traffic
    /// while it keeps forwarding what still arrives (LB-06: fail health first, then leave):
    /// from now on `/healthz` and every healthCheckNodePort answer 503.
    pub fn begin_drain(&self) {
        self.lock().draining = true;
    }

    /// Whether [`ProxyHealth::begin_drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.lock().draining
    }

    /// What the healthCheckNodePort servers report as `serviceProxyHealthy` (TP-09): the sync
    /// loop is healthy and xlb is not draining. Node deletion does not matter there.
    pub fn serving(&self) -> bool {
        self.is_healthy() && !self.is_draining()
    }

    fn proxy_health(&self, now: SystemTime) -> (bool, Option<SystemTime>) {
        let i = self.lock();
        let older = |t: SystemTime| now.duration_since(t).is_ok_and(|d| d > self.timeout);
        let stale = older(i.last_updated.unwrap_or(self.created));
        let pending_late = i.oldest_pending.is_some_and(older);
        (!stale && !pending_late && i.stalled_workers.is_empty(), i.last_updated)
    }

    /// `/healthz` (HC-01..03), now.
    pub fn healthz(&self) -> HealthStatus {
        self.healthz_at(SystemTime::now())
    }

    /// `/healthz` as it answers at `now`.
    pub fn healthz_at(&self, now: SystemTime) -> HealthStatus {
        let (ok, last) = self.proxy_health(now);
        let node_eligible = self.node_eligible();
        let healthy = ok && node_eligible && !self.is_draining();
        HealthStatus { healthy, last_updated: if healthy { Some(now) } else { last }, current_time: now, node_eligible }
    }

    /// `/livez` (HC-04), now.
    pub fn livez(&self) -> HealthStatus {
        self.livez_at(SystemTime::now())
    }

    /// `/livez` as it answers at `now`.
    pub fn livez_at(&self, now: SystemTime) -> HealthStatus {
        let (healthy, last) = self.proxy_health(now);
        HealthStatus {
            healthy,
            last_updated: if healthy { Some(now) } else { last },
            current_time: now,
            node_eligible: true,
        }
    }
}

/// How long a worker's heartbeat may stand still before the worker counts as stalled: its
/// loop stores it about once a second ([`WorkerCounters::heartbeat_ms`]), also when idle (an
/// idle loop sleeps at most 1 ms in `poll(2)`), so 5 s is four missed beats at least.
pub const WORKER_STALL_LIMIT: Duration = Duration::from_secs(5);

/// Tells the workers whose loop stands still from their heartbeats
/// ([`WorkerCounters::heartbeat_ms`]): a worker stuck in a loop, or whose thread ended (a
/// panic closes its sockets; the steering program then drops its queue's frames), no longer
/// advances its own. Read by the control loop about once a second while the workers run.
#[derive(Debug)]
pub struct WorkerStallWatch {
    workers: Vec<Beat>,
    limit: Duration,
    /// The last call of [`WorkerStallWatch::stalled`].
    last_check: Instant,
}

#[derive(Debug)]
struct Beat {
    id: u16,
    counters: Arc<WorkerCounters>,
    /// The heartbeat last read, and when it was first read with that value.
    last: u64,
    since: Instant,
}

impl WorkerStallWatch {
    /// The longest time between two calls of [`WorkerStallWatch::stalled`] after which a
    /// heartbeat standing still still counts.
    pub const CHECK_GAP: Duration = Duration::from_secs(2);

    /// Watches `workers` (id, counters) from `now` on: a worker whose heartbeat does not move
    /// for longer than `limit` from now on is stalled.
    pub fn new(workers: Vec<(u16, Arc<WorkerCounters>)>, limit: Duration, now: Instant) -> Self {
        let workers = workers
            .into_iter()
            .map(|(id, counters)| {
                let last = counters.heartbeat_ms.get();
                Beat { id, counters, last, since: now }
            })
            .collect();
        Self { workers, limit, last_check: now }
    }

    /// The workers, in the order given, whose heartbeat has not moved for longer than the
    /// limit at `now` (each read once per call). Meant to be called about once a second: after
    /// a gap of more than [`WorkerStallWatch::CHECK_GAP`] since the last call (the caller
    /// itself did not run: the whole process stopped, or its loop was held up) every worker
    /// is judged afresh from `now`, since its heartbeat's standing still then says nothing of
    /// the worker.
    pub fn stalled(&mut self, now: Instant) -> Vec<u16> {
        let gap = now.saturating_duration_since(self.last_check) > Self::CHECK_GAP;
        self.last_check = now;
        for b in &mut self.workers {
            let v = b.counters.heartbeat_ms.get();
            if v != b.last || gap {
                (b.last, b.since) = (v, now);
            }
        }
        self.workers.iter().filter(|b| now.saturating_duration_since(b.since) > self.limit).map(|b| b.id).collect()
    }
}

/// Formats a time as Go's `time.Time.String()` in UTC, which kube-proxy's health JSON uses:
/// `2006-01-02 15:04:05.999999999 +0000 UTC` (fraction without trailing zeros); `None` is
/// Go's zero time.
pub fn go_time(t: Option<SystemTime>) -> String {
    const ZERO: &str = "0001-01-01 00:00:00 +0000 UTC";
    let Some(t) = t else { return ZERO.to_owned() };
    match k8s_openapi::jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.strftime("%Y-%m-%d %H:%M:%S%.f +0000 UTC").to_string(),
        Err(_) => ZERO.to_owned(),
    }
}
