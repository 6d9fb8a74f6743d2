//! The Kubernetes source: watches Services, EndpointSlices (`discovery.k8s.io/v1`) and this
//! node's own Node, and hands consistent [`Snapshot`]s to the caller with kube-proxy's sync
//! timing (SYNC-01..08). The caller translates them ([`crate::translate::Translator::update`],
//! equal to the one pure function [`crate::translate::build_spec`] of the same objects), builds
//! and publishes the tables, and reports back with
//! [`Source::published`] (metrics and health) or [`Source::sync_failed`] (retry).
//!
//! # Watching
//! Each kind has a kube-rs `watcher` with `.default_backoff()` (client-go's: 0.8 s doubling to
//! 30 s, with jitter, reset after 120 s of success) reflected into a `Store`. Errors are
//! logged and counted (`xlb_watch_errors_total{resource}`), never end a stream and never
//! clear a store: while the API server is unreachable the last good objects stay and so do
//! the tables (ROLE-14). An in-stream `ERROR` 410 Expired makes the watcher relist; the store
//! swaps in the complete new list at once, so objects deleted during the gap disappear then,
//! and xlb treats a relist as a full resync. The Node is watched with the field selector
//! `metadata.name=NODE` (HC-07); only its labels and addresses affect the tables, its
//! `deletionTimestamp` goes to the health server.
//!
//! The API server must be reached at its own address (ROLE-13): pass a kubeconfig whose
//! `server` is the real API server endpoint to [`client`]. In-cluster configuration uses
//! `KUBERNETES_SERVICE_HOST`/`_PORT`, which default to the `kubernetes` Service VIP that xlb
//! itself programs; a DaemonSet must override both with the API server's address.
//!
//! # Timing
//! [`Source::next_snapshot`] yields nothing until every initial list is complete, then a
//! [`SyncReason::Initial`] snapshot. After that, changes mark the state dirty and are
//! coalesced: a snapshot is yielded at once when the previous one is at least
//! `minSyncPeriod` old, else when it becomes so (kube-proxy's `BoundedFrequencyRunner`
//! without its burst of 2), and a [`SyncReason::Periodic`] full resync when none was
//! yielded for `syncPeriod`.
//!
//! # Wiring (what `xlb run --kubeconfig` does)
//! ```no_run
//! # async fn run(cfg: xlb::config::Config) -> Result<(), Box<dyn std::error::Error>> {
//! use dataplane::tables::{TableBuilder, TablesHandle};
//! let telemetry = xlb::http::Telemetry::new(cfg.sync_period);
//! let _healthz = xlb::http::serve_healthz(cfg.healthz_bind_address, telemetry.clone()).await?;
//! let _metrics = xlb::http::serve_metrics(cfg.metrics_bind_address, telemetry.metrics.clone()).await?;
//! let mut hc = xlb::http::HealthCheckServers::new("0.0.0.0".parse()?, telemetry.health.clone());
//! let kubeconfig = std::path::Path::new("/etc/xlb/kubeconfig");
//! let client = xlb::k8s::client(Some(kubeconfig), &cfg.client_connection).await?;
//! let source_cfg = xlb::k8s::SourceConfig::from_config(&cfg)?;
//! let node = source_cfg.node_name.clone();
//! let mut source = xlb::k8s::Source::start(client, source_cfg, telemetry.clone());
//! let (mut builder, handle) = (TableBuilder::new(), TablesHandle::default());
//! let mut translator = xlb::translate::Translator::new();
//! loop {
//!     let snap = source.next_snapshot().await;
//!     let built = translator
//!         .update(&snap.cluster, &[], &snap.changes, &cfg)
//!         .map_err(|e| e.to_string())
//!         .and_then(|_| builder.build(translator.spec()).map_err(|e| e.to_string()));
//!     match built {
//!         Ok(tables) => {
//!             handle.publish(tables);
//!             source.published(&snap, &translator.report());
//!             for e in hc.sync(&xlb::k8s::health_check_services_indexed(&snap.cluster, &node)).await {
//!                 tracing::warn!("{e}");
//!             }
//!         }
//!         Err(e) => {
//!             tracing::error!("{e}; keeping the running tables");
//!             source.sync_failed(snap);
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! # Rebuilding only what changed (SYNC-03)
//! The source keeps the watch caches' objects indexed ([`crate::cluster::ClusterIndex`]:
//! Services by namespace and name, EndpointSlices by their Service), and brings the index up
//! to date from the objects each watch event names, so a snapshot after one change costs
//! O(log objects), not a copy and sort of every object; a relist, the first and the periodic
//! snapshots index everything again. [`Snapshot::changes`] names the Services a snapshot
//! touches ([`crate::cluster::ServiceRef`]; slices map to their Service through `kubernetes.io/service-name`,
//! and a slice that moved away or lost its label also names the Service it left), or is
//! [`crate::cluster::Changes::Full`]. The control thread's [`crate::translate::Translator::update`] translates
//! and assembles again only those Services (and, even for a full one, translates only the
//! Services whose `resourceVersion`s changed), keeping every other Service's spec (`Arc`), and
//! a `TableBuilder` rebuilds only what it finds changed. The snapshot holds the watch caches'
//! own objects (`Arc`s).
//! Figures: `docs/benchmarks.md`, "Control-plane scale".
//!
//! # Assigning LoadBalancer addresses
//! With config `addressAssignment.enabled`, [`Assigner`] gives the LoadBalancer Services of
//! xlb's class their addresses from the `XlbIPPool` objects and writes their status, one xlb
//! at a time ([`LeaseLock`], a `coordination.k8s.io` Lease).
//!
//! # L2 membership
//! With `announce.mode: l2`, [`Membership`] keeps this node's per-node Lease
//! (`xlb-node-<nodeName>`) renewed while the dataplane is healthy and watches the other
//! nodes' Leases; the control thread gives each L2 VIP to one owner among the members that
//! would announce it (`crate::announce::l2::owned`).

mod assigner;
mod hcnp;
mod lease;
mod membership;
mod ratelimit;
mod source;

use std::path::{Path, PathBuf};

pub use assigner::{Assigner, AssignerConfig, AssignerStats, FIELD_MANAGER};
pub use hcnp::{health_check_services, health_check_services_indexed};
pub use lease::{LeaseConfig, LeaseLock};
pub use membership::{
    LEASE_PREFIX, MEMBER_LABEL, MemberTable, Membership, MembershipConfig, MembershipStats, lease_name,
};
pub use ratelimit::{DEFAULT_BURST, DEFAULT_QPS, RateLimit, RateLimitError, RateLimitLayer, RateLimitService};
pub use source::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, Published, Snapshot, Source, SourceConfig, SourceObserver, SyncReason,
};

/// Errors of the Kubernetes source.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// The kubeconfig file cannot be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither in-cluster configuration nor a default kubeconfig was found.
    #[error("no Kubernetes client configuration (in-cluster or $KUBECONFIG/~/.kube/config): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The client cannot be built from the configuration.
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// `clientConnection` holds a rate limit client-go would refuse.
    #[error("{0}")]
    RateLimit(#[from] RateLimitError),
    /// The configuration names no node.
    #[error(
        "no node name: set nodeName (or hostnameOverride) in the xlb configuration, or the NODE_NAME environment variable"
    )]
    NoNodeName,
}

/// A Kubernetes client: from the kubeconfig file `kubeconfig` (its current context) when
/// given, else inferred (in-cluster service account, then `$KUBECONFIG` or `~/.kube/config`),
/// rate limited by `connection` as client-go limits kube-proxy's client ([`client_for`]).
/// `http://` servers work too (used by the tests' fake API server).
///
/// # Errors
/// [`K8sError::Kubeconfig`], [`K8sError::Infer`], [`K8sError::RateLimit`] or
/// [`K8sError::Client`].
pub async fn client(
    kubeconfig: Option<&Path>,
    connection: &crate::config::ClientConnectionConfig,
) -> Result<kube::Client, K8sError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| K8sError::Kubeconfig { path: path.to_owned(), source };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.map_err(err)?
        }
        None => kube::Config::infer().await?,
    };
    tracing::info!(server = %config.cluster_url, "Kubernetes API server");
    client_for(config, connection)
}

/// A client for `config` whose requests wait on the token bucket of `connection`
/// ([`RateLimit::from_client_connection`]: qps 0 → 5, burst 0 → 10, negative qps → no
/// limit): kube's default stack ([`kube::client::ClientBuilder`] from the config) with a
/// [`RateLimitLayer`] on top. Clones of the client share the bucket.
///
/// # Errors
/// [`K8sError::RateLimit`] for a `connection` client-go refuses, [`K8sError::Client`] when
/// kube cannot build its stack from `config`.
pub fn client_for(
    config: kube::Config,
    connection: &crate::config::ClientConnectionConfig,
) -> Result<kube::Client, K8sError> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(match RateLimit::from_client_connection(connection)? {
        Some(limit) => {
            tracing::info!(qps = limit.qps, burst = limit.burst.get(), "API client rate limit");
            builder.with_layer(&RateLimitLayer::new(limit)).build()
        }
        None => {
            tracing::info!("API client not rate limited (clientConnection.qps < 0)");
            builder.build()
        }
    })
}
