//! Announcing this node's VIPs to the network: which addresses ([`announced`], a pure function
//! of the cluster state and its translation), and through what ([`Announcer`]; BGP through
//! BIRD 2 is [`bird::Bird`], ARP/NDP answered on the local network is [`l2::L2`]). [`Announcement`] drives an announcer from the control loop:
//! it calls it only when the set changes, and again after a failure.
//!
//! # What is announced
//! A host prefix (IPv4 /32, IPv6 /128) for each address that
//! - is a `status.loadBalancer.ingress[].ip` of a LoadBalancer Service of xlb's class
//!   (`loadBalancerClass`, or none with `handleDefaultLoadBalancerClass`), or, with
//!   `announce.externalIPs`, a `spec.externalIPs[]` entry of any Service; and
//! - reaches, through the translation ([`crate::translate`]), a service spec with at least one
//!   backend eligible for new flows: any ready endpoint under `externalTrafficPolicy: Cluster`
//!   (a serving terminating one when none is ready, TP-08), one on this node under `Local`
//!   (TP-02, TP-06). Locality and readiness are the translation's own decisions, read off the
//!   spec's backends; nothing is decided again here.
//!
//! The control loop announces that set only while this node is healthy (what `/healthz`
//! answers: tables synced recently, Node not being deleted, not draining after SIGTERM), and
//! the empty set otherwise. An address shared by several Services (several ports) is announced
//! while any of them has a usable endpoint.

pub mod bird;
pub mod l2;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dataplane::tables::{FrontendKind, TablesSpec};

use crate::cluster::{ClusterIndex, ClusterState, ServiceRef};
use crate::config::Config;
use crate::translate::TranslateError;
use k8s_openapi::api::core::v1::Service;

pub use bird::Bird;
pub use l2::L2;

/// A set of VIPs to announce, each as a host prefix (/32 for IPv4, /128 for IPv6). Sorted
/// (IPv4 before IPv6, then by address), so what is written from it is stable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PrefixSet(BTreeSet<IpAddr>);

impl PrefixSet {
    /// The empty set (everything withdrawn).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `addr`; true if it was not there.
    pub fn insert(&mut self, addr: IpAddr) -> bool {
        self.0.insert(addr)
    }

    /// Whether `addr` is announced.
    pub fn contains(&self, addr: &IpAddr) -> bool {
        self.0.contains(addr)
    }

    /// Whether nothing is announced.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many addresses.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The addresses, IPv4 first, each in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = &IpAddr> {
        self.0.iter()
    }
}

impl FromIterator<IpAddr> for PrefixSet {
    fn from_iter<T: IntoIterator<Item = IpAddr>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for PrefixSet {
    /// `10.0.0.1/32, 2001:db8::1/128`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}/{}", if a.is_ipv4() { 32 } else { 128 })?;
        }
        Ok(())
    }
}

/// Which Services' addresses this node may announce, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope<'a> {
    /// `loadBalancerClass`: LoadBalancer Services of this class are xlb's.
    pub class: Option<&'a str>,
    /// `handleDefaultLoadBalancerClass`: LoadBalancer Services without a class are xlb's.
    pub default_class: bool,
    /// `announce.externalIPs`: announce `spec.externalIPs` too.
    pub external_ips: bool,
}

impl<'a> Scope<'a> {
    /// The scope `cfg` sets.
    pub fn from_config(cfg: &'a Config) -> Self {
        Self {
            class: cfg.load_balancer_class.as_deref(),
            default_class: cfg.handle_default_load_balancer_class,
            external_ips: cfg.announce.external_ips,
        }
    }

    /// Whether a LoadBalancer Service with `spec.loadBalancerClass` = `class` is xlb's.
    fn owns_class(&self, class: Option<&str>) -> bool {
        match class {
            None => self.default_class,
            Some(c) => self.class == Some(c),
        }
    }
}

/// The VIPs to announce while this node is healthy (module doc, "What is announced").
///
/// Pure: `spec` must be the translation of `cluster` ([`crate::translate::build_spec`] or
/// [`crate::translate::Translator::build`] with the same config); `cluster` supplies only what
/// the spec does not carry: each Service's type and `loadBalancerClass`. A spec is matched to
/// its Service by its name, `namespace/name:…` (namespaces and names cannot hold `:` or `/`).
pub fn announced(cluster: &ClusterState, spec: &TablesSpec, scope: &Scope<'_>) -> PrefixSet {
    let by_name: HashMap<(&str, &str), &Service> = cluster
        .services
        .iter()
        .map(|svc| {
            let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
            ((ns, svc.metadata.name.as_deref().unwrap_or_default()), &**svc)
        })
        .collect();
    announced_with(spec, scope, |ns, name| by_name.get(&(ns, name)).copied())
}

/// [`announced`] of an indexed cluster (what the Kubernetes source keeps): looks up only the
/// Services of specs with a LoadBalancer frontend, O(specs) in all.
pub fn announced_indexed(cluster: &ClusterIndex, spec: &TablesSpec, scope: &Scope<'_>) -> PrefixSet {
    announced_with(spec, scope, |ns, name| cluster.service(&ServiceRef::new(ns, name)).map(|s| &**s))
}

/// [`announced`] with the Service `(namespace, name)` looked up by `service`.
fn announced_with<'a>(
    spec: &TablesSpec,
    scope: &Scope<'_>,
    service: impl Fn(&str, &str) -> Option<&'a Service>,
) -> PrefixSet {
    // The Service's LoadBalancer ingress IPs are ours to announce.
    let lb_ours = |spec_name: &str| {
        let Some((ns, name)) = service_of(spec_name) else { return false };
        let s = service(ns, name).and_then(|svc| svc.spec.as_ref());
        let is_lb = s.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
        is_lb && scope.owns_class(s.and_then(|s| s.load_balancer_class.as_deref()))
    };
    let mut out = PrefixSet::new();
    for s in &spec.services {
        let usable = s.backends.iter().any(|b| b.eligible && b.weight > 0);
        if !usable {
            continue;
        }
        let mut lb_ok = None;
        for fe in &s.frontends {
            let take = match fe.kind {
                FrontendKind::LoadBalancer => *lb_ok.get_or_insert_with(|| lb_ours(&s.name)),
                FrontendKind::ExternalIp => scope.external_ips,
                FrontendKind::ClusterIp | FrontendKind::NodePort => false,
            };
            if take {
                out.insert(fe.addr);
            }
        }
    }
    out
}

/// `(namespace, name)` of the Service a spec named `namespace/name:port[/…]` comes from.
fn service_of(spec_name: &str) -> Option<(&str, &str)> {
    let (ns, rest) = spec_name.split_once('/')?;
    let (name, _) = rest.split_once(':')?;
    Some((ns, name))
}

/// [`announced`] for `cluster` translated with `cfg` ([`crate::translate::build_spec`]): the
/// whole computation from the cluster state, for `xlb check` and tests.
///
/// # Errors
/// [`TranslateError`] when `cfg` is invalid.
pub fn announced_for(cluster: &ClusterState, cfg: &Config) -> Result<PrefixSet, TranslateError> {
    let (spec, _) = crate::translate::build_spec(cluster, cfg)?;
    Ok(announced(cluster, &spec, &Scope::from_config(cfg)))
}

/// What an [`Announcer`] did with a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The daemon already has exactly this set from this announcer: nothing was written or
    /// reconfigured.
    Unchanged,
    /// The daemon took the set; `reply` is its answer (for BIRD, the lines of `birdc
    /// configure` after the welcome line, codes included).
    Reconfigured {
        /// Whether a file had to be written (false: the files already held the set, e.g. after
        /// a restart or hand-over of xlb, and the daemon was only asked to read them again).
        written: bool,
        /// The daemon's answer.
        reply: String,
    },
}

/// Why announcing failed. Each variant names the file, socket or program at fault; after an
/// error the daemon keeps what it had (BIRD keeps running its previous configuration when the
/// new one does not parse).
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    /// A prefix file (or its temporary file or directory) could not be written.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file xlb writes (not its temporary name).
        path: PathBuf,
        /// The system error.
        source: std::io::Error,
    },
    /// The control program could not be started.
    #[error("running {} -s {}: {source}", program.display(), socket.display())]
    Spawn {
        /// The program (`birdc`).
        program: PathBuf,
        /// The daemon's control socket.
        socket: PathBuf,
        /// The system error.
        source: std::io::Error,
    },
    /// The control program did not finish in time and was killed.
    #[error("{} -s {} configure: no answer within {timeout:?}; killed", program.display(), socket.display())]
    Timeout {
        /// The program.
        program: PathBuf,
        /// The daemon's control socket.
        socket: PathBuf,
        /// The time it had.
        timeout: Duration,
    },
    /// The daemon answered with an error (for BIRD, a final reply code other than 0003,
    /// 0004 or 0005: e.g. `8002 bird.conf:6:1 syntax error…`); it keeps its previous
    /// configuration.
    #[error("BIRD at {} refused the configuration: {reply}", socket.display())]
    Refused {
        /// The daemon's control socket.
        socket: PathBuf,
        /// The daemon's answer (all of its lines, codes included).
        reply: String,
    },
    /// L2 mode: writing an interface's `l2_addrs` map or sending a gratuitous ARP /
    /// unsolicited Neighbor Advertisement failed (the error names the interface).
    #[error("L2 announcement: {source}")]
    L2 {
        /// What nic-config reported.
        #[source]
        source: nic_config::NicError,
    },
    /// The control program gave no reply code (e.g. it could not connect to the socket).
    #[error("{} -s {} configure gave no reply ({status}): {output}", program.display(), socket.display())]
    NoReply {
        /// The program.
        program: PathBuf,
        /// The daemon's control socket.
        socket: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed (standard output and error).
        output: String,
    },
}

/// Something that makes a routing daemon announce exactly a [`PrefixSet`] from this node.
///
/// Implementations: [`bird::Bird`] (BIRD 2), [`l2::L2`] (ARP/NDP answered by this node). The daemon runs on its own; an announcer only
/// changes what it announces, so a restart of xlb never resets a BGP session.
pub trait Announcer: fmt::Debug + Send {
    /// Makes the daemon announce `set` and withdraw whatever else this announcer had it
    /// announce. Cheap when nothing changed ([`Applied::Unchanged`]).
    ///
    /// # Errors
    /// [`AnnounceError`]; the daemon then keeps announcing what it did before.
    fn announce(&mut self, set: &PrefixSet) -> Result<Applied, AnnounceError>;

    /// For logs: what is announced through what, e.g. `BIRD at /run/bird/bird.ctl`.
    fn describe(&self) -> String;
}

/// The announcer for `cfg.announce`, or `None` in mode `none`. `responders` are used in mode
/// `l2` only: one per answering interface (`announce.l2.interfaces`, default all of xlb's),
/// from [`nic_config::Steering::l2_responder`].
pub fn from_config(cfg: &Config, responders: Vec<nic_config::L2Responder>) -> Option<Box<dyn Announcer>> {
    match cfg.announce.mode {
        crate::config::AnnounceMode::None => None,
        crate::config::AnnounceMode::Bgp => Some(Box::new(Bird::new(&cfg.announce.bird))),
        crate::config::AnnounceMode::L2 => Some(Box::new(L2::new(responders))),
    }
}

/// Drives an [`Announcer`] from the control loop: [`Announcement::sync`] with the wanted set on
/// every tick calls the announcer only when the set differs from the one last applied, or,
/// after a failure, once `retry` has passed.
#[derive(Debug)]
pub struct Announcement {
    announcer: Box<dyn Announcer>,
    /// The set the announcer last applied successfully; `None` before the first success and
    /// after a failure.
    applied: Option<PrefixSet>,
    /// When the last attempt failed, and the set it tried.
    failed: Option<(Instant, PrefixSet)>,
    retry: Duration,
}

impl Announcement {
    /// Drives `announcer`, retrying a failed change every `retry`.
    pub fn new(announcer: Box<dyn Announcer>, retry: Duration) -> Self {
        Self { announcer, applied: None, failed: None, retry }
    }

    /// The set last applied successfully, if any.
    pub fn applied(&self) -> Option<&PrefixSet> {
        self.applied.as_ref()
    }

    /// The announcer, for logs.
    pub fn announcer(&self) -> &dyn Announcer {
        &*self.announcer
    }

    /// Makes `want` announced. `None` when nothing was attempted (`want` is what was last
    /// applied, or the last attempt failed less than `retry` before `now` and `want` is the
    /// same as then); else the announcer's result.
    pub fn sync(&mut self, want: &PrefixSet, now: Instant) -> Option<Result<Applied, AnnounceError>> {
        if self.applied.as_ref() == Some(want) {
            return None;
        }
        if let Some((t, tried)) = &self.failed
            && now.saturating_duration_since(*t) < self.retry
            && tried == want
        {
            return None;
        }
        self.sync_now(want, now)
    }

    /// As [`Announcement::sync`], without waiting for the retry period after a failure (for a
    /// withdrawal at stop, which has no later tick).
    pub fn sync_now(&mut self, want: &PrefixSet, now: Instant) -> Option<Result<Applied, AnnounceError>> {
        if self.applied.as_ref() == Some(want) {
            return None;
        }
        let r = self.announcer.announce(want);
        match &r {
            Ok(_) => {
                self.applied = Some(want.clone());
                self.failed = None;
            }
            Err(_) => {
                self.applied = None;
                self.failed = Some((now, want.clone()));
            }
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests;
