//! The decisions of `xlb run` that need no live process, out of the binary so that they can
//! be unit-tested: how a build is published and the steering maps follow it ([`publish`]), the
//! workers' settings from the configuration ([`settings`]), and how a reloaded file's objects
//! replace the running ones ([`take_reloaded`]).
//!
//! The binary (`control/src/run.rs`) keeps the threads, signals, workers, sockets and the
//! hand-over, and calls these. What touches the kernel is behind [`publish::SteeringMaps`] and
//! [`publish::Kernel`]; time is a parameter.

pub mod publish;
pub mod settings;

pub use publish::{
    Builders, Built, Input, Kernel, LiveKernel, PublishError, Published, Publisher, SteeringMaps, sync_steering,
    sync_steering_touched,
};
pub use settings::{SNAT_PORTS, control_cpus, pipeline_config, resume_config, worker_ports, xsk_config, xsk_layout};

use crate::cluster::{ClusterState, object_changes};

/// Puts a reloaded file's objects (`reloaded`) in place of `cluster`'s, keeping
/// `cluster.local_addresses` (read from the host, not the file). Returns how many Services and
/// how many EndpointSlices were added, changed or removed ([`object_changes`]: what a watch
/// would have counted, for `kubeproxy_sync_proxy_rules_service_changes_total` and
/// `..._endpoint_changes_total`).
///
/// A reload that fails to load never gets here: the running objects and tables stay.
pub fn take_reloaded(cluster: &mut ClusterState, reloaded: ClusterState) -> (u64, u64) {
    let services = object_changes(&cluster.services, &reloaded.services);
    let endpoints = object_changes(&cluster.endpoint_slices, &reloaded.endpoint_slices);
    let local = std::mem::take(&mut cluster.local_addresses);
    *cluster = reloaded;
    cluster.local_addresses = local;
    (services, endpoints)
}

#[cfg(test)]
mod tests;
