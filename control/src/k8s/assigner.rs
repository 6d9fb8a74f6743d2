//! The Kubernetes address assigner: while this xlb holds the Lease ([`super::lease`]), it
//! watches the `XlbIPPool` objects and the Services, runs the allocator
//! ([`crate::ipam::assign`]) and writes each changed Service's `status.loadBalancer.ingress`
//! with a JSON merge patch of the `services/status` subresource.
//!
//! Every patch carries the `metadata.resourceVersion` the decision was made from, so a patch
//! computed from a stale view fails with 409 Conflict instead of overwriting a newer status;
//! the next round (on the next watch event, or after the retry period) decides again. That
//! protects only the Service patched: a round can run before the watch has delivered a status
//! just written, and would give that address to another Service. So the statuses written are
//! remembered, and laid over the watch view, until the view has caught up with them (the
//! Service seen at the patch's `resourceVersion` or later, replaced, or deleted); leadership
//! changes forget them. The assignment is a pure function of the pools and the Services'
//! statuses, so a new leader (after a restart or a fail-over) decides the same and writes
//! nothing. Services that cannot get an address are logged once per reason (xlb may not
//! write Events: its RBAC allows only `services/status`). With no usable pool at all nothing
//! is written: an empty or deleted pool list does not clear every Service's address.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::lease::{LeaseConfig, LeaseLock};
use crate::ipam::{self, ClassFilter, Options, Outcome, PoolSet, ServiceKey, XlbIPPool};

/// The field manager of xlb's status patches.
pub const FIELD_MANAGER: &str = "xlb";

/// Settings of the [`Assigner`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignerConfig {
    /// The Lease that makes one xlb at a time the assigner.
    pub lease: LeaseConfig,
    /// Which Services are xlb's (config `loadBalancerClass`, `handleDefaultLoadBalancerClass`).
    pub filter: ClassFilter,
    /// How often the Lease is renewed or tried (client-go's `RetryPeriod`, 2 s), and the
    /// longest time between two assignment rounds.
    pub retry_period: Duration,
}

impl AssignerConfig {
    /// The settings config `addressAssignment` asks for; the Lease identity is
    /// `NODE/PID` (unique per process, so a new xlb of a hand-over is a candidate of its own).
    pub fn from_config(cfg: &crate::config::Config, node: &str) -> Self {
        let a = &cfg.address_assignment;
        Self {
            lease: LeaseConfig {
                namespace: a.lease_namespace.clone(),
                name: a.lease_name.clone(),
                identity: format!("{node}/{}", std::process::id()),
                lease_duration: a.lease_duration,
                renew_deadline: a.lease_duration * 2 / 3,
            },
            filter: ClassFilter::from_config(cfg),
            retry_period: a.lease_duration * 2 / 15,
        }
    }
}

/// What the assigner has done so far, for tests and logs.
#[derive(Debug, Default)]
pub struct AssignerStats {
    /// Rounds of the loop run (Lease tried, and assignment run when leader).
    pub rounds: AtomicU64,
    /// Rounds run as leader with both watch caches ready.
    pub assignment_rounds: AtomicU64,
    /// Status patches accepted by the API server.
    pub patches: AtomicU64,
    /// Status patches refused with 409 Conflict (stale view; decided again next round).
    pub conflicts: AtomicU64,
    /// Whether this xlb holds the Lease (as of the last round).
    pub leader: AtomicBool,
}

/// A running assigner; [`Assigner::stop`] releases the Lease.
#[derive(Debug)]
pub struct Assigner {
    stats: Arc<AssignerStats>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Assigner {
    /// Starts the watchers and the loop on the current tokio runtime.
    pub fn start(client: kube::Client, cfg: AssignerConfig) -> Self {
        let stats = Arc::new(AssignerStats::default());
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(client, cfg, stats.clone(), stop_rx));
        Self { stats, stop, task }
    }

    /// Counters and the leader flag.
    pub fn stats(&self) -> &Arc<AssignerStats> {
        &self.stats
    }

    /// Stops the loop and releases the Lease if held (so another xlb takes over at once).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Drives a watcher into a store, waking `notify` on every event.
fn watch_into<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    notify: Arc<Notify>,
    what: &'static str,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::warn!(resource = what, error = %e, "address assigner: watch error (retrying)");
            }
            notify.notify_one();
        }
    })
}

async fn run(client: kube::Client, cfg: AssignerConfig, stats: Arc<AssignerStats>, mut stop: watch::Receiver<bool>) {
    let notify = Arc::new(Notify::new());
    let (services, w_services) = reflector::store::<Service>();
    let (pools, w_pools) = reflector::store::<XlbIPPool>();
    let watchers = [
        watch_into(Api::<Service>::all(client.clone()), w_services, notify.clone(), "services"),
        watch_into(Api::<XlbIPPool>::all(client.clone()), w_pools, notify.clone(), "xlbippools"),
    ];
    let ready = Arc::new(AtomicBool::new(false));
    {
        let (s, p, ready, notify) = (services.clone(), pools.clone(), ready.clone(), notify.clone());
        tokio::spawn(async move {
            if s.wait_until_ready().await.is_ok() && p.wait_until_ready().await.is_ok() {
                ready.store(true, Ordering::Release);
                notify.notify_one();
            }
        });
    }
    let mut lock = LeaseLock::new(client.clone(), cfg.lease.clone());
    let mut next_renew = Instant::now();
    let mut memory = Memory::default();
    loop {
        if Instant::now() >= next_renew {
            let was = lock.is_leader();
            match lock.try_acquire_or_renew().await {
                Ok(_) => {}
                Err(e) => tracing::warn!(lease = %cfg.lease.name, error = %e, "address assigner: lease"),
            }
            let now = lock.is_leader();
            if now != was {
                tracing::info!(lease = %cfg.lease.name, identity = %cfg.lease.identity, leader = now, "address assigner: leadership changed");
                memory = Memory::default();
            }
            next_renew = Instant::now() + cfg.retry_period;
        }
        stats.leader.store(lock.is_leader(), Ordering::Relaxed);
        if lock.is_leader() && ready.load(Ordering::Acquire) {
            reconcile(&client, &services, &pools, &cfg.filter, &stats, &mut memory).await;
            stats.assignment_rounds.fetch_add(1, Ordering::Relaxed);
        }
        stats.rounds.fetch_add(1, Ordering::Relaxed);
        let wait = next_renew.saturating_duration_since(Instant::now());
        tokio::select! {
            _ = stop.changed() => break,
            () = notify.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
    for w in watchers {
        w.abort();
    }
    if let Err(e) = lock.release().await {
        tracing::warn!(lease = %cfg.lease.name, error = %e, "address assigner: releasing the lease");
    }
    stats.leader.store(false, Ordering::Relaxed);
}

/// What was last logged, so each problem is logged once, and the statuses written that the
/// watch has not delivered yet. Reset when leadership changes.
#[derive(Debug, Default)]
struct Memory {
    rejected: Vec<String>,
    failures: BTreeMap<ServiceKey, String>,
    no_pools: bool,
    written: BTreeMap<ServiceKey, Written>,
}

/// A status patch the API server accepted, kept until the watch view has caught up with it.
#[derive(Debug)]
struct Written {
    /// `metadata.uid` of the Service patched.
    uid: Option<String>,
    /// The `resourceVersion` the patch was conditioned on.
    from: Option<String>,
    /// The `resourceVersion` the patch returned.
    to: Option<String>,
    /// The addresses written.
    addresses: Vec<IpAddr>,
}

impl Written {
    /// Whether `svc` (the watch view's object of the same key) already includes this write:
    /// another object (deleted and created again), or a `resourceVersion` at least the one the
    /// patch returned (when not numbers: any other than the one the patch was made from).
    fn seen_in(&self, svc: &Service) -> bool {
        let m = &svc.metadata;
        if m.uid != self.uid {
            return true;
        }
        let num = |rv: &Option<String>| rv.as_deref().and_then(|v| v.parse::<u64>().ok());
        match (num(&m.resource_version), num(&self.to)) {
            (Some(seen), Some(to)) => seen >= to,
            _ => m.resource_version != self.from,
        }
    }
}

async fn reconcile(
    client: &kube::Client,
    services: &Store<Service>,
    pools: &Store<XlbIPPool>,
    filter: &ClassFilter,
    stats: &AssignerStats,
    memory: &mut Memory,
) {
    let pool_objs = pools.state();
    let specs: Vec<(String, &ipam::PoolSpec)> =
        pool_objs.iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), &p.spec)).collect();
    let (set, rejected) = PoolSet::build(specs.iter().map(|(n, s)| (n.as_str(), *s)));
    let rejected: Vec<String> =
        rejected.iter().map(|r| format!("XlbIPPool {}, field spec.{}: {}", r.pool, r.field, r.message)).collect();
    if rejected != memory.rejected {
        for r in &rejected {
            tracing::warn!("address pool not used: {r}");
        }
        memory.rejected = rejected;
    }
    if set.is_empty() {
        // No pool (none yet, all invalid, or the CRD objects deleted): clearing every
        // Service's address for that would be drastic; leave the statuses alone.
        if !memory.no_pools {
            tracing::warn!("no usable XlbIPPool: no LoadBalancer address is assigned or changed");
            memory.no_pools = true;
        }
        return;
    }
    memory.no_pools = false;
    let mut svcs = services.state();
    // A status written is taken in every later round, even one run before the watch delivers
    // it: the view would show that Service without its address, and the allocator would give
    // the address to another Service (whose own patch the API server accepts).
    let view: BTreeMap<ServiceKey, &Arc<Service>> = svcs.iter().map(|s| (ServiceKey::of(s), s)).collect();
    memory.written.retain(|key, w| view.get(key).is_some_and(|s| !w.seen_in(s)));
    for svc in &mut svcs {
        if let Some(w) = memory.written.get(&ServiceKey::of(svc)) {
            ipam::apply_to_service(Arc::make_mut(svc), &w.addresses);
        }
    }
    svcs.sort_by(|a, b| crate::cluster::object_order(&a.metadata).cmp(&crate::cluster::object_order(&b.metadata)));
    let assignment = ipam::assign(&set, &svcs, filter, Options::default());
    let mut failures = BTreeMap::new();
    for (key, o) in &assignment.services {
        if let Outcome::Failed(e) = o {
            let msg = e.to_string();
            if memory.failures.get(key) != Some(&msg) {
                tracing::warn!(service = %key, "no LoadBalancer address: {msg}");
            }
            failures.insert(key.clone(), msg);
        }
    }
    memory.failures = failures;
    let by_key: BTreeMap<ServiceKey, &Arc<Service>> = svcs.iter().map(|s| (ServiceKey::of(s), s)).collect();
    for (key, addrs) in assignment.changes(&svcs) {
        let Some(svc) = by_key.get(&key) else { continue };
        let ingress = if addrs.is_empty() {
            serde_json::Value::Null
        } else {
            addrs.iter().map(|a| json!({"ip": a.to_string()})).collect()
        };
        let patch = json!({
            "metadata": {"resourceVersion": svc.metadata.resource_version},
            "status": {"loadBalancer": {"ingress": ingress}},
        });
        let api: Api<Service> = Api::namespaced(client.clone(), &key.namespace);
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match api.patch_status(&key.name, &params, &Patch::Merge(&patch)).await {
            Ok(written) => {
                stats.patches.fetch_add(1, Ordering::Relaxed);
                memory.written.insert(
                    key.clone(),
                    Written {
                        uid: svc.metadata.uid.clone(),
                        from: svc.metadata.resource_version.clone(),
                        to: written.metadata.resource_version,
                        addresses: addrs.to_vec(),
                    },
                );
                let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
                tracing::info!(service = %key, addresses = %list.join(","), "LoadBalancer status written");
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                stats.conflicts.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(service = %key, "status patch conflict (stale view); deciding again");
            }
            Err(e) => tracing::warn!(service = %key, error = %e, "writing the LoadBalancer status"),
        }
    }
}
