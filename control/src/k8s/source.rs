//! [`Source`]: watchers, reflectors and the sync loop's timing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::cluster::{Changes, ClusterIndex, ClusterState, ServiceRef, object_order};
use crate::config::Config;
use crate::k8s::K8sError;
use crate::translate::TranslateReport;

/// Where the Kubernetes source reports what it sees and what it published: implemented by
/// the HTTP layer's [`crate::http::Telemetry`] (`/metrics`, `/healthz`, `/livez`), or by a
/// test's recorder. The source depends on this interface, not on the HTTP layer.
pub trait SourceObserver: Send + Sync + std::fmt::Debug {
    /// A change was queued at `at` (`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`,
    /// and `/healthz`'s pending update, HC-02).
    fn change_queued(&self, at: SystemTime);
    /// One Service add, update or delete (`kubeproxy_sync_proxy_rules_service_changes_total`).
    fn service_changed(&self);
    /// One EndpointSlice add, update or delete (`..._endpoint_changes_total`).
    fn endpoints_changed(&self);
    /// This node's Node object as last seen (`None`: absent), for `/healthz`'s node
    /// eligibility (HC-03).
    fn node_seen(&self, node: Option<&Node>);
    /// A watch of `resource` (`services`, `endpointslices`, `nodes`) failed and is retried.
    fn watch_error(&self, resource: &'static str);
    /// A snapshot's tables were published ([`Source::published`]).
    fn published(&self, p: Published<'_>);
}

/// What [`SourceObserver::published`] is told, as kube-proxy's `syncProxyRules` records at
/// its end.
#[derive(Debug, Clone, Copy)]
pub struct Published<'a> {
    /// From the snapshot's start to the publication
    /// (`kubeproxy_sync_proxy_rules_duration_seconds`).
    pub took: Duration,
    /// When it was published (`..._last_timestamp_seconds`; `/healthz`'s last update).
    pub at: SystemTime,
    /// Per change in the snapshot, from its trigger time to now
    /// (`kubeproxy_network_programming_duration_seconds`, MET-03).
    pub programming: &'a [Duration],
    /// MET-04 counts from the translation's report.
    pub no_local_endpoints: crate::translate::NoLocalEndpoints,
    /// The oldest change that arrived during the sync and is still pending, if any.
    pub pending_since: Option<SystemTime>,
}

/// Annotation the EndpointSlice controller sets to the time of the Pod or Service change that
/// caused the slice's last update (kube-proxy's network programming latency starts there).
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// Annotation `kubectl apply` leaves on objects: a copy of the object, dropped from the
/// stores to save memory.
const ANNOTATION_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// At most this many change times are kept for the network programming histogram per sync;
/// more changes between two syncs are still synced, their latencies are not all observed.
const MAX_TRIGGERS: usize = 10_000;
/// Shortest wait before a sync that failed is retried (used when `minSyncPeriod` is shorter).
const MIN_RETRY: Duration = Duration::from_secs(1);

/// Settings of a [`Source`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// This node's name: the Node object watched (field selector `metadata.name=`, HC-07).
    pub node_name: String,
    /// Minimum time between two snapshots after a change (`minSyncPeriod`, SYNC-01/02;
    /// kube-proxy's `BoundedFrequencyRunner` `minInterval`). Zero = a snapshot per change
    /// (changes that arrive while the caller is busy still coalesce).
    pub min_sync_period: Duration,
    /// Longest time between two snapshots: a full resync is yielded when nothing else was
    /// for this long (`syncPeriod`, SYNC-04; the runner's `maxInterval`).
    pub sync_period: Duration,
    /// `timeoutSeconds` of each watch call; `None` = kube-rs's default (290 s). The API server
    /// closes the watch after it and the watcher resumes from its last resourceVersion.
    pub watch_timeout_s: Option<u32>,
}

impl SourceConfig {
    /// kube-proxy's defaults: `minSyncPeriod` 1 s, `syncPeriod` 30 s (CFG-03).
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            watch_timeout_s: None,
        }
    }

    /// From the xlb configuration: `nodeName`/`hostnameOverride`, `minSyncPeriod`,
    /// `syncPeriod`.
    ///
    /// # Errors
    /// [`K8sError::NoNodeName`] when neither `nodeName` nor `hostnameOverride` is set.
    pub fn from_config(cfg: &Config) -> Result<Self, K8sError> {
        let name = cfg.node_name().ok_or(K8sError::NoNodeName)?;
        Ok(Self {
            node_name: name.to_owned(),
            min_sync_period: cfg.min_sync_period,
            sync_period: cfg.sync_period,
            watch_timeout_s: None,
        })
    }
}

/// Why a snapshot was yielded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncReason {
    /// The first snapshot, once every initial list is complete.
    Initial,
    /// Services, EndpointSlices or the Node changed (batched by `minSyncPeriod`), or a failed
    /// sync is retried.
    Changes,
    /// Nothing was yielded for `syncPeriod`: periodic full resync (SYNC-04).
    Periodic,
}

/// One consistent view of the cluster to translate and publish.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// 1 for the first snapshot, then +1 each.
    pub generation: u64,
    /// Why it was yielded.
    pub reason: SyncReason,
    /// What changed since the previous snapshot ([`Changes::Full`] for the first, periodic,
    /// relist and retry snapshots).
    pub changes: Changes,
    /// Every Service and EndpointSlice, indexed, and this node's Node object (`None` if it does
    /// not exist): the source's own index, shared. The source updates it in place for the
    /// next snapshot when no one else holds it, so drop the snapshot (or this `Arc`) before
    /// asking for the next one; a copy still alive then makes the source copy the index
    /// (O(objects)), nothing worse. [`Source::cluster`] reads it without holding it.
    pub cluster: Arc<ClusterIndex>,
    /// When the snapshot was taken: the start of the sync (`sync_proxy_rules_duration`).
    pub started: Instant,
    /// When the oldest change in this snapshot was queued (wall clock).
    pub oldest_queued: Option<SystemTime>,
    /// Per change: when it happened (the slice's last-change-trigger-time annotation, else
    /// when xlb saw it). Observed into the network programming histogram on publish.
    triggers: Vec<SystemTime>,
}

impl Snapshot {
    /// The flat form of [`Snapshot::cluster`] (sorted by namespace and name), for
    /// [`crate::translate::build_spec`] and other users of [`ClusterState`]; O(objects).
    pub fn state(&self) -> ClusterState {
        self.cluster.to_state(&[])
    }

    /// Number of changes (Service/EndpointSlice/Node events) this snapshot covers.
    pub fn change_count(&self) -> usize {
        self.triggers.len()
    }
}

/// The watched kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Services = 0,
    EndpointSlices = 1,
    Nodes = 2,
}

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Self::Services => "services",
            Self::EndpointSlices => "endpointslices",
            Self::Nodes => "nodes",
        }
    }
}

/// The node fields a table depends on (name, zone and other labels, addresses).
#[derive(Debug, Clone, PartialEq)]
struct NodeFingerprint {
    labels: Option<BTreeMap<String, String>>,
    addresses: Option<Vec<NodeAddress>>,
}

impl NodeFingerprint {
    fn of(n: Option<&Node>) -> Option<Self> {
        n.map(|n| Self {
            labels: n.metadata.labels.clone(),
            addresses: n.status.as_ref().and_then(|s| s.addresses.clone()),
        })
    }
}

#[derive(Debug, Default)]
struct Pending {
    /// Initial list complete, per [`Kind`].
    ready: [bool; 3],
    changes: Changes,
    /// EndpointSlices (namespace, name) added, changed or deleted since the last snapshot.
    slices: BTreeSet<(String, String)>,
    dirty: bool,
    oldest_queued: Option<SystemTime>,
    triggers: Vec<SystemTime>,
    /// After a failed sync: not before this instant.
    not_before: Option<Instant>,
    node: Option<NodeFingerprint>,
}

#[derive(Debug)]
struct Shared {
    pending: Mutex<Pending>,
    notify: Notify,
    telemetry: Arc<dyn SourceObserver>,
    started: SystemTime,
    node_name: String,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks a change (kube-proxy's `Sync()`: `QueuedUpdate` + last-queued timestamp).
    fn queue(&self, p: &mut Pending, trigger: Option<SystemTime>) {
        let now = SystemTime::now();
        p.dirty = true;
        p.oldest_queued.get_or_insert(now);
        if p.triggers.len() < MAX_TRIGGERS {
            // Like kube-proxy's endpointsChangeTracker, times from before the start are not
            // this process's latency.
            p.triggers.push(trigger.filter(|t| *t >= self.started).unwrap_or(now));
        }
        self.telemetry.change_queued(now);
    }

    fn service_event(&self, s: &Service) {
        self.telemetry.service_changed();
        let mut p = self.lock();
        p.changes.add(ServiceRef::of_service(s));
        self.queue(&mut p, None);
        drop(p);
        self.notify.notify_one();
    }

    fn slice_event(&self, s: &EndpointSlice, deleted: bool) {
        let (ns, name) = object_order(&s.metadata);
        let key = (ns.to_owned(), name.to_owned());
        let Some(r) = ServiceRef::of_slice(s) else {
            // Not used by the translation, unless it was before (it lost its label): the
            // snapshot's index knows, so the sync is due but no change is counted.
            let mut p = self.lock();
            p.slices.insert(key);
            p.dirty = true;
            drop(p);
            self.notify.notify_one();
            return;
        };
        self.telemetry.endpoints_changed();
        let trigger = if deleted { None } else { trigger_time(s) };
        let mut p = self.lock();
        p.changes.add(r);
        p.slices.insert(key);
        self.queue(&mut p, trigger);
        drop(p);
        self.notify.notify_one();
    }

    fn node_event(&self, store: &Store<Node>) {
        let node = find_node(store, &self.node_name);
        self.telemetry.node_seen(node.as_deref());
        let fp = NodeFingerprint::of(node.as_deref());
        let mut p = self.lock();
        if p.node != fp {
            p.node = fp;
            if p.ready[Kind::Nodes as usize] {
                p.changes.set_full();
                self.queue(&mut p, None);
            }
        }
        drop(p);
        self.notify.notify_one();
    }

    /// An initial list (or a relist) is complete.
    fn list_done(&self, kind: Kind) {
        let mut p = self.lock();
        let i = kind as usize;
        if p.ready[i] {
            // A relist after 410 Expired or a restart: objects deleted in the gap are gone
            // from the store without a Delete event, so everything is rebuilt.
            tracing::info!(resource = kind.resource(), "relist complete; full resync queued");
            p.changes.set_full();
            self.queue(&mut p, None);
        } else {
            p.ready[i] = true;
            tracing::info!(resource = kind.resource(), "initial list complete");
        }
        drop(p);
        self.notify.notify_one();
    }
}

/// `t + d`, saturating at about a year ahead (periods are validated to be sane, but an
/// `Instant` overflow would panic).
fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d.min(Duration::from_secs(365 * 86_400))).unwrap_or(t)
}

/// Whether a snapshot is due at `now` (`Ok(reason)`), else when one will be if nothing changes
/// before (`Err(Some(when))`; `Err(None)` while an initial list is missing). `last_sync`: when
/// the last snapshot was yielded. A change is yielded once the last snapshot is `minSyncPeriod`
/// old (and after a failed sync not before [`Pending::not_before`]), a periodic resync once it
/// is `syncPeriod` old, whichever comes first. Time is a parameter: the timing is tested
/// without waiting.
fn sync_due(
    p: &Pending,
    last_sync: Option<Instant>,
    cfg: &SourceConfig,
    now: Instant,
) -> Result<SyncReason, Option<Instant>> {
    if !p.ready.iter().all(|r| *r) {
        return Err(None);
    }
    let Some(last) = last_sync else { return Ok(SyncReason::Initial) };
    let periodic = after(last, cfg.sync_period);
    if p.dirty {
        let min = after(last, cfg.min_sync_period);
        let due = p.not_before.map_or(min, |t| t.max(min));
        if now >= due {
            return Ok(SyncReason::Changes);
        }
        if now >= periodic {
            return Ok(SyncReason::Periodic);
        }
        return Err(Some(due.min(periodic)));
    }
    if now >= periodic {
        return Ok(SyncReason::Periodic);
    }
    Err(Some(periodic))
}

/// The earliest retry after a sync that failed at `now`: `minSyncPeriod` later, at least
/// [`MIN_RETRY`].
fn retry_not_before(now: Instant, cfg: &SourceConfig) -> Instant {
    after(now, cfg.min_sync_period.max(MIN_RETRY))
}

fn trigger_time(s: &EndpointSlice) -> Option<SystemTime> {
    let v = s.metadata.annotations.as_ref()?.get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME)?;
    let ts: k8s_openapi::jiff::Timestamp = v.parse().ok()?;
    Some(SystemTime::from(ts))
}

fn find_node(store: &Store<Node>, name: &str) -> Option<Arc<Node>> {
    store.find(|n| n.metadata.name.as_deref() == Some(name))
}

/// Drops what the stores need not keep: `managedFields` and kubectl's last-applied copy.
fn strip<K: Resource>(o: &mut K) {
    let m = o.meta_mut();
    m.managed_fields = None;
    if let Some(a) = m.annotations.as_mut() {
        a.remove(ANNOTATION_LAST_APPLIED);
    }
}

/// Watches Services, EndpointSlices and this node's Node, and yields [`Snapshot`]s with
/// kube-proxy's sync timing. See [the module docs](crate::k8s).
pub struct Source {
    shared: Arc<Shared>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    cfg: SourceConfig,
    tasks: Vec<JoinHandle<()>>,
    last_sync: Option<Instant>,
    generation: u64,
    /// The stores' objects, indexed; brought up to date with each snapshot's changes.
    index: Arc<ClusterIndex>,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("cfg", &self.cfg)
            .field("generation", &self.generation)
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Source {
    /// Starts the three watchers (each `.default_backoff()` and reflected into a store) as
    /// tasks on the current Tokio runtime. Returns at once; the first
    /// [`next_snapshot`](Self::next_snapshot) waits for the initial lists.
    ///
    /// `telemetry` receives what the watchers see: each change updates
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` and the health server's
    /// pending-update time; Node changes update its `nodeEligible`; watch errors count in
    /// `xlb_watch_errors_total`.
    ///
    /// # Panics
    /// Outside a Tokio runtime context (call it inside `Runtime::block_on`, a task, or after
    /// `Handle::enter`).
    pub fn start(client: Client, cfg: SourceConfig, telemetry: impl SourceObserver + 'static) -> Self {
        let telemetry: Arc<dyn SourceObserver> = Arc::new(telemetry);
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            notify: Notify::new(),
            telemetry,
            started: SystemTime::now(),
            node_name: cfg.node_name.clone(),
        });
        let mut wc = watcher::Config::default();
        if let Some(t) = cfg.watch_timeout_s {
            wc = wc.timeout(t);
        }
        let (services, w_services) = reflector::store::<Service>();
        let (slices, w_slices) = reflector::store::<EndpointSlice>();
        let (nodes, w_nodes) = reflector::store::<Node>();
        let node_wc = wc.clone().fields(&format!("metadata.name={}", cfg.node_name));
        let tasks = vec![
            tokio::spawn(watch_loop(
                Api::<Service>::all(client.clone()),
                wc.clone(),
                w_services,
                Kind::Services,
                shared.clone(),
                |sh: &Shared, s: &Service, _deleted| sh.service_event(s),
            )),
            tokio::spawn(watch_loop(
                Api::<EndpointSlice>::all(client.clone()),
                wc,
                w_slices,
                Kind::EndpointSlices,
                shared.clone(),
                |sh: &Shared, s: &EndpointSlice, deleted| sh.slice_event(s, deleted),
            )),
            tokio::spawn(node_loop(Api::<Node>::all(client), node_wc, w_nodes, nodes.clone(), shared.clone())),
        ];
        Self {
            shared,
            services,
            slices,
            nodes,
            cfg,
            tasks,
            last_sync: None,
            generation: 0,
            index: Arc::new(ClusterIndex::new()),
        }
    }

    /// Whether every initial list is complete.
    pub fn is_ready(&self) -> bool {
        self.shared.lock().ready.iter().all(|r| *r)
    }

    /// The settings.
    pub fn config(&self) -> &SourceConfig {
        &self.cfg
    }

    /// Waits for the next snapshot:
    /// - none until the initial lists of Services, EndpointSlices and the Node are all
    ///   complete (no empty-table blip); then the first, [`SyncReason::Initial`];
    /// - after a change, at once if the previous snapshot is at least `minSyncPeriod` old,
    ///   else when it becomes so; every change in between is coalesced into it (SYNC-01);
    /// - a [`SyncReason::Periodic`] full resync when nothing was yielded for `syncPeriod`.
    ///
    /// Watch errors never clear anything: the stores keep the last good objects while the
    /// watchers back off and retry, and a relist after 410 Expired replaces a store's
    /// contents only once it is complete.
    ///
    /// Cancel-safe: dropping the future (in `select!` or `timeout`) loses nothing.
    pub async fn next_snapshot(&mut self) -> Snapshot {
        let shared = self.shared.clone();
        loop {
            let notified = shared.notify.notified();
            match self.poll_due(Instant::now()) {
                Ok(s) => return s,
                Err(Some(deadline)) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(deadline.into()) => {}
                    }
                }
                Err(None) => notified.await,
            }
        }
    }

    /// The snapshot [`next_snapshot`](Self::next_snapshot) would return now, if one is due;
    /// never waits. For a caller with its own loop.
    pub fn try_next_snapshot(&mut self) -> Option<Snapshot> {
        self.poll_due(Instant::now()).ok()
    }

    /// When the next snapshot is due if nothing changes before: now or earlier when one is
    /// due, `None` while waiting for the initial lists.
    pub fn next_deadline(&self) -> Option<Instant> {
        let now = Instant::now();
        let p = self.shared.lock();
        match self.deadline(&p, now) {
            Ok(_) => Some(now),
            Err(d) => d,
        }
    }

    /// `Ok(reason)` if a snapshot is due, else `Err(when)` ([`sync_due`]).
    fn deadline(&self, p: &Pending, now: Instant) -> Result<SyncReason, Option<Instant>> {
        sync_due(p, self.last_sync, &self.cfg, now)
    }

    fn poll_due(&mut self, now: Instant) -> Result<Snapshot, Option<Instant>> {
        let mut p = self.shared.lock();
        let reason = self.deadline(&p, now)?;
        let mut changes = std::mem::take(&mut p.changes);
        if reason != SyncReason::Changes {
            changes.set_full();
        }
        p.dirty = false;
        p.not_before = None;
        let oldest_queued = p.oldest_queued.take();
        let triggers = std::mem::take(&mut p.triggers);
        let slices = std::mem::take(&mut p.slices);
        drop(p);
        // The stores are read after the pending changes were taken: a change that lands in
        // between is in this state and again in the next snapshot's changes (harmless), never
        // missing from both.
        self.update_index(&mut changes, &slices);
        self.last_sync = Some(now);
        self.generation += 1;
        tracing::debug!(
            generation = self.generation,
            ?reason,
            full = changes.is_full(),
            changes = triggers.len(),
            services = self.index.service_count(),
            endpoint_slices = self.index.slice_count(),
            "snapshot"
        );
        let cluster = Arc::clone(&self.index);
        Ok(Snapshot { generation: self.generation, reason, changes, cluster, started: now, oldest_queued, triggers })
    }

    /// Brings the index up to date with the stores: all of it for [`Changes::Full`], else
    /// only the Services in `changes` and the EndpointSlices in `slices` (O(changes ×
    /// log objects)); adds to `changes` the Services whose slices moved away or lost their
    /// label.
    fn update_index(&mut self, changes: &mut Changes, slices: &BTreeSet<(String, String)>) {
        let node = find_node(&self.nodes, &self.cfg.node_name);
        if changes.is_full() {
            let mut ix = ClusterIndex::new();
            for s in self.services.state() {
                ix.set_service(s);
            }
            for s in self.slices.state() {
                ix.set_slice(s);
            }
            ix.node = node.map(|n| Node::clone(&n));
            self.index = Arc::new(ix);
            return;
        }
        let ix = Arc::make_mut(&mut self.index);
        if ix.node.as_ref() != node.as_deref() {
            ix.node = node.map(|n| Node::clone(&n));
        }
        let mut touched = Vec::new();
        if let Changes::Services(refs) = &*changes {
            for r in refs {
                match self.services.get(&ObjectRef::new(&r.name).within(&r.namespace)) {
                    Some(s) => {
                        ix.set_service(s);
                    }
                    None => {
                        ix.remove_service(r);
                    }
                }
            }
        }
        for (ns, name) in slices {
            match self.slices.get(&ObjectRef::new(name).within(ns)) {
                Some(s) => touched.extend(ix.set_slice(s)),
                None => touched.extend(ix.remove_slice(ns, name)),
            }
        }
        for r in touched {
            changes.add(r);
        }
    }

    /// The stores' objects as of the last snapshot, indexed (the index a snapshot shares).
    pub fn cluster(&self) -> &ClusterIndex {
        &self.index
    }

    /// Reports that `snap`'s tables were built and published (atomically swapped in), at
    /// this moment. Records, as kube-proxy's `syncProxyRules` does at its end:
    /// - `kubeproxy_sync_proxy_rules_duration_seconds`: from [`Snapshot::started`] to now;
    /// - `kubeproxy_sync_proxy_rules_last_timestamp_seconds` = now;
    /// - `kubeproxy_network_programming_duration_seconds`: for each change in the
    ///   snapshot, from its trigger time to now (MET-03);
    /// - `kubeproxy_sync_proxy_rules_no_local_endpoints_total` from `report` (MET-04);
    /// - the health server's last update (`/healthz` and `/livez`, HC-02, SYNC-05).
    pub fn published(&self, snap: &Snapshot, report: &TranslateReport) {
        let now = SystemTime::now();
        let programming: Vec<Duration> =
            snap.triggers.iter().map(|t| now.duration_since(*t).unwrap_or_default()).collect();
        // Changes that arrived during this sync are still pending.
        let p = self.shared.lock();
        let pending = if p.dirty { p.oldest_queued } else { None };
        drop(p);
        self.shared.telemetry.published(Published {
            took: snap.started.elapsed(),
            at: now,
            programming: &programming,
            no_local_endpoints: report.no_local_endpoints,
            pending_since: pending,
        });
    }

    /// Reports that `snap` could not be built or published (the running tables stay). Its
    /// changes are queued again as a full resync, retried after `minSyncPeriod` (at least
    /// 1 s); `/healthz` turns 503 if this goes on for 2 × `syncPeriod` (SYNC-05).
    pub fn sync_failed(&self, snap: Snapshot) {
        let mut p = self.shared.lock();
        p.changes.set_full();
        p.dirty = true;
        p.not_before = Some(retry_not_before(Instant::now(), &self.cfg));
        p.oldest_queued = Some(match (p.oldest_queued, snap.oldest_queued) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or_else(SystemTime::now),
        });
        let room = MAX_TRIGGERS.saturating_sub(p.triggers.len());
        p.triggers.extend(snap.triggers.into_iter().take(room));
        drop(p);
        self.shared.notify.notify_one();
    }
}

/// Runs one watcher into its store until the task is aborted. Errors are logged and
/// counted; the stream is never stopped on them (the watcher recovers by itself after the
/// backoff).
async fn watch_loop<K, F>(
    api: Api<K>,
    wc: watcher::Config,
    writer: reflector::store::Writer<K>,
    kind: Kind,
    shared: Arc<Shared>,
    on_change: F,
) where
    K: Resource<DynamicType = ()> + Clone + fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    F: Fn(&Shared, &K, bool) + Send + 'static,
{
    let stream = watcher::watcher(api, wc).default_backoff().modify(strip::<K>).reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(o)) => on_change(&shared, &o, false),
            Ok(Event::Delete(o)) => on_change(&shared, &o, true),
            Ok(Event::Init) => tracing::debug!(resource = kind.resource(), "list started"),
            Ok(Event::InitApply(_)) => {}
            Ok(Event::InitDone) => shared.list_done(kind),
            Err(e) => watch_error(&shared, kind, &e),
        }
    }
    tracing::error!(resource = kind.resource(), "watch stream ended");
}

async fn node_loop(
    api: Api<Node>,
    wc: watcher::Config,
    writer: reflector::store::Writer<Node>,
    store: Store<Node>,
    shared: Arc<Shared>,
) {
    let stream = watcher::watcher(api, wc).default_backoff().modify(strip::<Node>).reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(_) | Event::Delete(_)) => shared.node_event(&store),
            Ok(Event::Init | Event::InitApply(_)) => {}
            Ok(Event::InitDone) => {
                // Fingerprint first, so the first list itself is not a change.
                let first = !shared.lock().ready[Kind::Nodes as usize];
                if first {
                    let node = find_node(&store, &shared.node_name);
                    if node.is_none() {
                        tracing::warn!(node = shared.node_name, "this node's Node object does not exist (yet)");
                    }
                    shared.lock().node = NodeFingerprint::of(node.as_deref());
                    shared.telemetry.node_seen(node.as_deref());
                    shared.list_done(Kind::Nodes);
                } else {
                    // A relist: only a node that really changed makes a full resync.
                    shared.node_event(&store);
                }
            }
            Err(e) => watch_error(&shared, Kind::Nodes, &e),
        }
    }
    tracing::error!(resource = Kind::Nodes.resource(), "watch stream ended");
}

fn watch_error(shared: &Shared, kind: Kind, e: &watcher::Error) {
    tracing::warn!(
        resource = kind.resource(),
        error = %e,
        "watch error; retrying with backoff, the last good objects stay"
    );
    shared.telemetry.watch_error(kind.resource());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    fn ready() -> Pending {
        Pending { ready: [true; 3], ..Pending::default() }
    }

    fn cfg(min_ms: u64, period_ms: u64) -> SourceConfig {
        SourceConfig {
            min_sync_period: Duration::from_millis(min_ms),
            sync_period: Duration::from_millis(period_ms),
            ..SourceConfig::new("node-a")
        }
    }

    #[test]
    fn nothing_until_every_initial_list_then_the_initial_snapshot() {
        let (c, now) = (cfg(500, 30_000), Instant::now());
        let mut p = Pending { ready: [true, true, false], dirty: true, ..Pending::default() };
        assert_eq!(sync_due(&p, None, &c, now), Err(None), "the Node is not listed yet");
        p.ready = [true; 3];
        assert_eq!(sync_due(&p, None, &c, now), Ok(SyncReason::Initial));
    }

    #[test]
    fn sync_01_a_change_waits_until_the_last_snapshot_is_min_sync_period_old() {
        let (c, t0) = (cfg(500, 30_000), Instant::now());
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut p = ready();
        p.dirty = true;
        assert_eq!(sync_due(&p, Some(t0), &c, ms(100)), Err(Some(ms(500))), "coalesced until then");
        assert_eq!(sync_due(&p, Some(t0), &c, ms(499)), Err(Some(ms(500))));
        assert_eq!(sync_due(&p, Some(t0), &c, ms(500)), Ok(SyncReason::Changes));
        assert_eq!(sync_due(&p, Some(t0), &c, ms(10_000)), Ok(SyncReason::Changes), "an old snapshot: at once");
        let zero = cfg(0, 30_000);
        assert_eq!(sync_due(&p, Some(t0), &zero, t0), Ok(SyncReason::Changes), "minSyncPeriod 0: every change");
    }

    #[test]
    fn sync_04_a_full_resync_when_nothing_was_yielded_for_sync_period() {
        let (c, t0) = (cfg(500, 30_000), Instant::now());
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let p = ready();
        assert_eq!(sync_due(&p, Some(t0), &c, ms(29_999)), Err(Some(ms(30_000))));
        assert_eq!(sync_due(&p, Some(t0), &c, ms(30_000)), Ok(SyncReason::Periodic));
    }

    #[test]
    fn a_failed_sync_is_retried_after_min_sync_period_at_least_a_second() {
        let (c, t0) = (cfg(100, 30_000), Instant::now());
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(retry_not_before(t0, &c), ms(1000), "MIN_RETRY when minSyncPeriod is shorter");
        assert_eq!(retry_not_before(t0, &cfg(2500, 30_000)), ms(2500));
        let mut p = ready();
        p.dirty = true;
        p.not_before = Some(retry_not_before(t0, &c));
        assert_eq!(sync_due(&p, Some(t0), &c, ms(100)), Err(Some(ms(1000))), "minSyncPeriod alone would allow it");
        assert_eq!(sync_due(&p, Some(t0), &c, ms(1000)), Ok(SyncReason::Changes));
        // A retry later than the periodic resync: the resync comes first.
        p.not_before = Some(ms(40_000));
        assert_eq!(sync_due(&p, Some(t0), &c, ms(29_000)), Err(Some(ms(30_000))));
        assert_eq!(sync_due(&p, Some(t0), &c, ms(30_000)), Ok(SyncReason::Periodic));
    }
}
