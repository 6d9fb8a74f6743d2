//! Membership of the xlb nodes that announce VIPs in L2 mode, from per-node Leases
//! (`coordination.k8s.io/v1`).
//!
//! Every xlb node in L2 mode keeps its own Lease, `xlb-node-<nodeName>` in
//! `announce.l2.leaseNamespace`, labelled [`MEMBER_LABEL`]`=true`, with `holderIdentity` = the
//! node's name and `leaseDurationSeconds` = `announce.l2.leaseDuration`. It renews the Lease
//! (`spec.renewTime`) every `announce.l2.renewInterval` while its dataplane is healthy (what
//! `/healthz` answers), deletes it as soon as it is not (drain after SIGTERM, stale tables, Node
//! being deleted) and on a clean stop, so that the others take its VIPs over at once. It lists
//! and watches the labelled Leases of the namespace; a node is a member while its Lease was
//! seen renewed less than its `leaseDurationSeconds` ago ([`MemberTable`]).
//!
//! Expiry is judged on this node's clock from when it last saw the Lease's (`holderIdentity`,
//! `renewTime`) change, as client-go's leader election does, never by comparing `renewTime`
//! with the local clock: clock skew between nodes does not matter. A Lease seen for the first
//! time (at start, or after a relist) therefore counts as just renewed: a node that died
//! before this one started is dropped one `leaseDuration` after this one first saw its Lease.
//!
//! [`Membership::members`] is what the control thread asks for on every tick: the holders of
//! the unexpired Leases plus this node itself. Expiry is judged at `min(now, last successful
//! renewal of this node's Lease + 1.5 × renewInterval)`: while this node's own renewals
//! succeed that is `now`, and when they stop succeeding (the API server is unreachable, or
//! answers too slowly) this node's clock for the others' Leases stops, since it can no longer
//! tell a dead node from a Lease renewal it cannot see. A node cut off from the API server
//! therefore neither takes every VIP over nor drops its own; every node keeps its last view
//! until the API server answers again. With `renewInterval` at most a third of
//! `leaseDuration` (the config checks it), a Lease that was renewed up to the outage does not
//! expire before the clock stops. `None` before the first complete list, and before this
//! node's own Lease was first written since it became healthy (the owner of a VIP is not
//! known yet, and the others cannot see this node).
//!
//! The owner of each VIP is then `crate::announce::l2::owner` over the member names that
//! would announce it (`crate::announce::l2::owned`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The label every membership Lease carries (value `true`); the watch selects on it.
pub const MEMBER_LABEL: &str = "xlb.dev/l2-member";

/// The prefix of a node's membership Lease name: `xlb-node-<nodeName>`.
pub const LEASE_PREFIX: &str = "xlb-node-";

/// The name of `node`'s membership Lease: `xlb-node-<node>`.
#[must_use]
pub fn lease_name(node: &str) -> String {
    format!("{LEASE_PREFIX}{node}")
}

/// Settings of a [`Membership`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipConfig {
    /// Namespace of the Leases (`announce.l2.leaseNamespace`).
    pub namespace: String,
    /// This node's name (`nodeName`, `$NODE_NAME`): the Lease's `holderIdentity` and the
    /// member name the owner of a VIP is chosen among.
    pub node: String,
    /// `leaseDurationSeconds` of this node's Lease (`announce.l2.leaseDuration`; whole
    /// seconds, at least 1 s).
    pub lease_duration: Duration,
    /// How often this node's Lease is renewed while healthy (`announce.l2.renewInterval`).
    pub renew_interval: Duration,
}

impl MembershipConfig {
    /// The settings `cfg.announce.l2` asks for, for node `node`.
    pub fn from_config(cfg: &crate::config::Config, node: &str) -> Self {
        let l2 = &cfg.announce.l2;
        Self {
            namespace: l2.lease_namespace.clone(),
            node: node.to_owned(),
            lease_duration: l2.lease_duration,
            renew_interval: l2.renew_interval,
        }
    }
}

/// One Lease as last seen: its record and when this node saw that record first.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// `spec.holderIdentity`: the member's node name.
    holder: String,
    /// `spec.renewTime` as the API server returned it (compared, never parsed).
    renew: Option<String>,
    /// `spec.leaseDurationSeconds`.
    duration: Duration,
    /// When this record was first seen (this node's monotonic clock).
    at: Instant,
}

/// The membership Leases this node has seen, keyed by Lease name, with when each was last
/// seen renewed. Pure: fed with Lease objects and instants, so the expiry rules are tested
/// without an API server.
#[derive(Debug, Clone, Default)]
pub struct MemberTable {
    leases: BTreeMap<String, Seen>,
    /// `leaseDurationSeconds` assumed for a Lease without one.
    default_duration: Duration,
}

impl MemberTable {
    /// An empty table; a Lease without `leaseDurationSeconds` counts as `default_duration`.
    #[must_use]
    pub fn new(default_duration: Duration) -> Self {
        Self { leases: BTreeMap::new(), default_duration }
    }

    /// Notes `lease` as seen at `now`. A Lease whose (`holderIdentity`, `renewTime`) did not
    /// change keeps the instant it was first seen so; a changed one is dated `now`. A Lease
    /// without a `holderIdentity` is forgotten (nobody holds it).
    pub fn observe(&mut self, lease: &Lease, now: Instant) {
        let Some(name) = lease.metadata.name.clone() else { return };
        let spec = lease.spec.as_ref();
        let Some(holder) = spec.and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty()) else {
            self.leases.remove(&name);
            return;
        };
        let renew = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string());
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.default_duration, Duration::from_secs);
        let at = match self.leases.get(&name) {
            Some(old) if old.holder == holder && old.renew == renew => old.at,
            _ => now,
        };
        self.leases.insert(name, Seen { holder, renew, duration, at });
    }

    /// Forgets the Lease named `name` (deleted).
    pub fn forget(&mut self, name: &str) {
        self.leases.remove(name);
    }

    /// Replaces the table with a complete list (after a relist), keeping the instants of the
    /// Leases whose record did not change.
    pub fn replace_all<'a>(&mut self, leases: impl IntoIterator<Item = &'a Lease>, now: Instant) {
        let old = std::mem::take(&mut self.leases);
        let mut fresh = Self { leases: old, default_duration: self.default_duration };
        let mut names = BTreeSet::new();
        for l in leases {
            fresh.observe(l, now);
            if let Some(n) = &l.metadata.name {
                names.insert(n.clone());
            }
        }
        fresh.leases.retain(|n, _| names.contains(n));
        self.leases = fresh.leases;
    }

    /// The holders of the Leases unexpired at `now`: seen renewed less than their
    /// `leaseDurationSeconds` before `now`.
    #[must_use]
    pub fn live(&self, now: Instant) -> BTreeSet<String> {
        self.leases
            .values()
            .filter(|s| now.saturating_duration_since(s.at) < s.duration)
            .map(|s| s.holder.clone())
            .collect()
    }

    /// How many Leases are known (expired or not).
    #[must_use]
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether no Lease is known.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

/// What the task and the control thread share.
#[derive(Debug)]
struct Shared {
    table: MemberTable,
    /// The initial list of Leases is complete.
    listed: bool,
    /// When this node's Lease was last written successfully (created or renewed) since it
    /// last became healthy.
    renewed: Option<Instant>,
}

/// Counters of a [`Membership`], for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MembershipStats {
    /// Successful writes (create or renew) of this node's Lease.
    pub renewals: u64,
    /// Failed writes of this node's Lease.
    pub renew_errors: u64,
    /// Deletions of this node's Lease (unhealthy, stop).
    pub releases: u64,
}

/// This node's membership: a task on the current tokio runtime that renews this node's Lease
/// while [`Membership::set_healthy`] says so and watches the others' (module doc).
#[derive(Debug)]
pub struct Membership {
    cfg: MembershipConfig,
    shared: Arc<Mutex<Shared>>,
    stats: Arc<Mutex<MembershipStats>>,
    healthy: watch::Sender<bool>,
    /// `Some(release)` stops the task; `release`: delete this node's Lease first.
    stop: watch::Sender<Option<bool>>,
    task: JoinHandle<()>,
}

impl Membership {
    /// Starts the watch and the renewal task on the current tokio runtime. Nothing is renewed
    /// until [`Membership::set_healthy`]`(true)`.
    ///
    /// # Panics
    /// Outside a tokio runtime (as `tokio::spawn`).
    pub fn start(client: kube::Client, cfg: MembershipConfig) -> Self {
        let shared =
            Arc::new(Mutex::new(Shared { table: MemberTable::new(cfg.lease_duration), listed: false, renewed: None }));
        let stats = Arc::new(Mutex::new(MembershipStats::default()));
        let (healthy, healthy_rx) = watch::channel(false);
        let (stop, stop_rx) = watch::channel(None);
        let task = tokio::spawn(run(client, cfg.clone(), shared.clone(), stats.clone(), healthy_rx, stop_rx));
        Self { cfg, shared, stats, healthy, stop, task }
    }

    /// The settings.
    pub fn config(&self) -> &MembershipConfig {
        &self.cfg
    }

    /// Tells the task whether this node's dataplane is healthy (`/healthz` would answer 200).
    /// On a change to healthy the Lease is renewed at once; to unhealthy it is deleted at once.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.send_if_modified(|h| {
            let changed = *h != healthy;
            *h = healthy;
            changed
        });
    }

    /// The member node names at `now` (module doc): this node and the holders of the Leases
    /// unexpired at `min(now, last renewal + 1.5 × renewInterval)`. `None` before the first
    /// complete list of Leases, and while this node's Lease has not been written since it
    /// last became healthy.
    pub fn members(&self, now: Instant) -> Option<BTreeSet<String>> {
        let s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.listed {
            return None;
        }
        let renewed = s.renewed?;
        let clock = now.min(renewed + self.cfg.renew_interval * 3 / 2);
        let mut m = s.table.live(clock);
        m.insert(self.cfg.node.clone());
        Some(m)
    }

    /// Counters so far.
    pub fn stats(&self) -> MembershipStats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the task. With `release`, this node's Lease is deleted first (a clean stop: the
    /// others take its VIPs over at once); without (a hand-over: the new xlb of this node goes
    /// on renewing the same Lease), it is left to the next renewal or to expiry.
    pub async fn stop(self, release: bool) {
        let _ = self.stop.send(Some(release));
        let _ = self.task.await;
    }
}

async fn run(
    client: kube::Client,
    cfg: MembershipConfig,
    shared: Arc<Mutex<Shared>>,
    stats: Arc<Mutex<MembershipStats>>,
    mut healthy: watch::Receiver<bool>,
    mut stop: watch::Receiver<Option<bool>>,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let wcfg = watcher::Config::default().labels(&format!("{MEMBER_LABEL}=true"));
    let stream = watcher::watcher(api.clone(), wcfg).default_backoff();
    futures::pin_mut!(stream);
    let mut own = OwnLease { api: api.clone(), cfg: cfg.clone(), cached: None };
    let mut initial: Vec<Lease> = Vec::new();
    let mut next_renew = tokio::time::Instant::now();
    // A kube watcher stream does not end; should it, its branch is not polled again.
    let mut watching = true;
    let lock = || shared.lock().unwrap_or_else(PoisonError::into_inner);
    let count = |f: fn(&mut MembershipStats)| f(&mut stats.lock().unwrap_or_else(PoisonError::into_inner));
    let release = loop {
        // Read without marking it seen: a change made since is handled by `changed()` below.
        let is_healthy = *healthy.borrow();
        tokio::select! {
            r = stop.changed() => break r.is_err() || stop.borrow().unwrap_or(true),
            r = healthy.changed() => {
                if r.is_err() {
                    break true;
                }
                if *healthy.borrow_and_update() {
                    next_renew = tokio::time::Instant::now();
                } else {
                    // Unhealthy: leave at once, so the others take this node's VIPs over.
                    lock().renewed = None;
                    match own.delete().await {
                        Ok(()) => count(|s| s.releases += 1),
                        Err(e) => tracing::warn!(lease = %lease_name(&cfg.node), error = %e, "L2 membership: deleting this node's lease"),
                    }
                    tracing::info!(node = %cfg.node, "L2 membership: unhealthy, left (lease deleted)");
                }
            }
            () = tokio::time::sleep_until(next_renew), if is_healthy => {
                next_renew = tokio::time::Instant::now() + cfg.renew_interval;
                match own.renew().await {
                    Ok(()) => {
                        let first = lock().renewed.replace(Instant::now()).is_none();
                        count(|s| s.renewals += 1);
                        if first {
                            tracing::info!(node = %cfg.node, lease = %lease_name(&cfg.node), namespace = %cfg.namespace, "L2 membership: joined (lease written)");
                        }
                    }
                    Err(e) => {
                        count(|s| s.renew_errors += 1);
                        tracing::warn!(lease = %lease_name(&cfg.node), error = %e, "L2 membership: renewing this node's lease");
                    }
                }
            }
            ev = stream.next(), if watching => match ev {
                Some(Ok(watcher::Event::Init)) => initial.clear(),
                Some(Ok(watcher::Event::InitApply(l))) => initial.push(l),
                Some(Ok(watcher::Event::InitDone)) => {
                    let mut s = lock();
                    s.table.replace_all(initial.iter(), Instant::now());
                    s.listed = true;
                    initial.clear();
                }
                Some(Ok(watcher::Event::Apply(l))) => lock().table.observe(&l, Instant::now()),
                Some(Ok(watcher::Event::Delete(l))) => {
                    if let Some(n) = &l.metadata.name {
                        lock().table.forget(n);
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "L2 membership: lease watch error (retrying)"),
                None => {
                    tracing::error!("L2 membership: the lease watch ended; the members are no longer updated");
                    watching = false;
                }
            },
        }
    };
    if release {
        match own.delete().await {
            Ok(()) => {
                count(|s| s.releases += 1);
                tracing::info!(node = %cfg.node, "L2 membership: left (lease deleted)");
            }
            Err(e) => {
                tracing::warn!(lease = %lease_name(&cfg.node), error = %e, "L2 membership: deleting this node's lease")
            }
        }
    }
}

/// This node's own Lease: renewals (update with the last written object's
/// `resourceVersion`, falling back to get and create) and deletion.
#[derive(Debug)]
struct OwnLease {
    api: Api<Lease>,
    cfg: MembershipConfig,
    /// The object as last written by this node.
    cached: Option<Lease>,
}

impl OwnLease {
    fn spec(&self, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(
            k8s_openapi::jiff::Timestamp::try_from(SystemTime::now())
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        let secs = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX).max(1);
        LeaseSpec {
            holder_identity: Some(self.cfg.node.clone()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            ..Default::default()
        }
    }

    /// Writes a new `renewTime` (creating the Lease if it is missing).
    async fn renew(&mut self) -> Result<(), kube::Error> {
        let name = lease_name(&self.cfg.node);
        if let Some(mut l) = self.cached.take() {
            let acquired = l.spec.as_ref().and_then(|s| s.acquire_time.clone());
            l.spec = Some(self.spec(acquired));
            match self.api.replace(&name, &PostParams::default(), &l).await {
                Ok(w) => {
                    self.cached = Some(w);
                    return Ok(());
                }
                // Changed by someone else (the other process of a hand-over) or deleted:
                // read it again below.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        match self.api.get_opt(&name).await? {
            Some(mut l) => {
                let acquired = l.spec.as_ref().and_then(|s| s.acquire_time.clone());
                l.spec = Some(self.spec(acquired));
                let labels = l.metadata.labels.get_or_insert_with(Default::default);
                labels.insert(MEMBER_LABEL.into(), "true".into());
                self.cached = Some(self.api.replace(&name, &PostParams::default(), &l).await?);
            }
            None => {
                let l = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        labels: Some([(MEMBER_LABEL.to_owned(), "true".to_owned())].into()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(None)),
                };
                self.cached = Some(self.api.create(&PostParams::default(), &l).await?);
            }
        }
        Ok(())
    }

    /// Deletes the Lease (gone already is fine).
    async fn delete(&mut self) -> Result<(), kube::Error> {
        self.cached = None;
        match self.api.delete(&lease_name(&self.cfg.node), &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, holder: Option<&str>, renew_secs: i64, duration: i32) -> Lease {
        let t = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + renew_secs).unwrap();
        Lease {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: Some(MicroTime(t)),
                lease_duration_seconds: Some(duration),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_live_for_its_duration_after_its_renewal_was_seen() {
        let t0 = Instant::now();
        let mut t = MemberTable::new(Duration::from_secs(10));
        t.observe(&lease("xlb-node-a", Some("a"), 0, 2), t0);
        t.observe(&lease("xlb-node-b", Some("b"), 0, 4), t0);
        assert_eq!(t.live(t0 + Duration::from_millis(1999)), ["a", "b"].map(String::from).into());
        assert_eq!(t.live(t0 + Duration::from_secs(2)), ["b"].map(String::from).into(), "a expired at 2 s");
        // Seen again unchanged (a relist, a resync): still dated t0.
        t.observe(&lease("xlb-node-b", Some("b"), 0, 4), t0 + Duration::from_secs(3));
        assert!(t.live(t0 + Duration::from_secs(4)).is_empty(), "an unchanged record does not renew");
        // A renewal seen at 5 s: live until 9 s.
        t.observe(&lease("xlb-node-b", Some("b"), 5, 4), t0 + Duration::from_secs(5));
        assert_eq!(t.live(t0 + Duration::from_millis(8999)), ["b"].map(String::from).into());
        assert!(t.live(t0 + Duration::from_secs(9)).is_empty());
    }

    #[test]
    fn deleted_released_and_vanished_leases_are_not_members() {
        let t0 = Instant::now();
        let mut t = MemberTable::new(Duration::from_secs(10));
        for n in ["a", "b", "c"] {
            t.observe(&lease(&format!("xlb-node-{n}"), Some(n), 0, 10), t0);
        }
        t.forget("xlb-node-a");
        t.observe(&lease("xlb-node-b", None, 1, 10), t0);
        assert_eq!(t.live(t0), ["c"].map(String::from).into());
        // A relist that no longer has c, and a new d.
        let later = t0 + Duration::from_secs(1);
        t.replace_all([&lease("xlb-node-d", Some("d"), 1, 10)], later);
        assert_eq!(t.live(later), ["d"].map(String::from).into());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_relist_keeps_when_unchanged_leases_were_seen() {
        let t0 = Instant::now();
        let mut t = MemberTable::new(Duration::from_secs(10));
        t.observe(&lease("xlb-node-a", Some("a"), 0, 3), t0);
        t.replace_all([&lease("xlb-node-a", Some("a"), 0, 3)], t0 + Duration::from_secs(2));
        assert!(t.live(t0 + Duration::from_secs(3)).is_empty(), "the relist did not count as a renewal");
    }

    #[test]
    fn lease_names_carry_the_node_name() {
        assert_eq!(lease_name("worker-1"), "xlb-node-worker-1");
    }
}
