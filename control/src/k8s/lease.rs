//! Leader election on a `coordination.k8s.io/v1` Lease, client-go's algorithm
//! (`k8s.io/client-go/tools/leaderelection`, `LeaseLock`): get, create or update with the
//! Lease's `resourceVersion` as precondition, so of two candidates writing at once one gets
//! 409 Conflict and stays a follower.
//!
//! Why not a crate: `kube-leader-election` 0.44 is built on kube 4 (xlb uses kube 5), and
//! `kube-lease-manager` 0.13 (kube 5) takes the lease with server-side apply and strategic
//! merge patches, whose conflict detection relies on the API server's field ownership: it
//! needs the `patch` verb on leases and cannot be tested against xlb's fake API server
//! without emulating server-side apply. This needs only `get`, `create` and `update`.
//!
//! Expiry is judged on the local clock from when this candidate last saw the Lease record
//! change (as client-go does), not from `renewTime`, so clock skew between nodes does not
//! matter.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

/// Settings of a [`LeaseLock`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease (xlb's own, e.g. `kube-system`).
    pub namespace: String,
    /// Name of the Lease, e.g. `xlb-address-assignment`.
    pub name: String,
    /// This candidate's identity (`holderIdentity`): unique per process, e.g. `node-a/1234`.
    pub identity: String,
    /// `leaseDurationSeconds`: how long after the holder's last renewal (as seen by the
    /// others) they may take the Lease over. client-go's default is 15 s.
    pub lease_duration: Duration,
    /// How long the holder keeps acting without a successful renewal; below `lease_duration`
    /// so a holder that cannot renew stops before another may start (client-go: 10 s).
    pub renew_deadline: Duration,
}

/// A candidate for one Lease: call [`LeaseLock::try_acquire_or_renew`] every retry period
/// (client-go: 2 s) and act only while [`LeaseLock::is_leader`].
#[derive(Debug)]
pub struct LeaseLock {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// The record last seen (holder, renewTime, transitions) and when it was first seen so.
    observed: Option<(String, Option<String>, i32, Instant)>,
    /// When this candidate last acquired or renewed the Lease.
    renewed: Option<Instant>,
}

/// The seconds of a duration, for `leaseDurationSeconds` (at least 1).
fn whole_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX).max(1)
}

impl LeaseLock {
    /// A candidate using `client`; nothing is sent yet.
    pub fn new(client: kube::Client, cfg: LeaseConfig) -> Self {
        Self { api: Api::namespaced(client, &cfg.namespace), cfg, observed: None, renewed: None }
    }

    /// The settings.
    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    /// Whether this candidate holds the Lease: it acquired or renewed it less than
    /// `renew_deadline` ago.
    pub fn is_leader(&self) -> bool {
        self.renewed.is_some_and(|t| t.elapsed() < self.cfg.renew_deadline)
    }

    fn spec_for_us(&self, now: SystemTime, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let t =
            MicroTime(k8s_openapi::jiff::Timestamp::try_from(now).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(whole_seconds(self.cfg.lease_duration)),
            acquire_time: Some(acquired.unwrap_or_else(|| t.clone())),
            renew_time: Some(t),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One round: creates the Lease if it is missing, renews it if this candidate holds it,
    /// takes it over if its holder let it expire (or released it), and otherwise notes who
    /// holds it. Returns whether this candidate is the leader now.
    ///
    /// # Errors
    /// The API error of the get, create or update, other than 409 Conflict (another
    /// candidate won the race: `Ok(false)`). Leadership then lapses after `renew_deadline`.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = SystemTime::now();
        let Some(lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec_for_us(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.renewed = Some(Instant::now());
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let renew = spec.renew_time.as_ref().map(|t| t.0.to_string());
        let transitions = spec.lease_transitions.unwrap_or(0);
        let record = (holder.clone().unwrap_or_default(), renew, transitions);
        let seen = match &self.observed {
            Some((h, r, n, at)) if (h, r, n) == (&record.0, &record.1, &record.2) => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((record.0.clone(), record.1.clone(), record.2, at));
                at
            }
        };
        let ours = holder.as_deref() == Some(self.cfg.identity.as_str());
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.cfg.lease_duration, Duration::from_secs);
        if !ours && holder.is_some() && seen.elapsed() < duration {
            self.renewed = None;
            return Ok(false);
        }
        let new_spec = if ours {
            self.spec_for_us(now, spec.acquire_time.clone(), transitions)
        } else {
            self.spec_for_us(now, None, transitions + 1)
        };
        let mut updated = lease;
        updated.spec = Some(new_spec);
        match self.api.replace(&self.cfg.name, &PostParams::default(), &updated).await {
            Ok(_) => {
                self.renewed = Some(Instant::now());
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                self.renewed = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this candidate holds it (clears `holderIdentity` and sets a
    /// 1-second duration, as client-go's `ReleaseOnCancel`), so another takes over at once.
    ///
    /// # Errors
    /// The API error of the get or update.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        if !self.is_leader() {
            return Ok(());
        }
        self.renewed = None;
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else { return Ok(()) };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await.map(|_| ())
    }
}
