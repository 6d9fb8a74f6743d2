//! xlb control plane as a library: the configuration ([`config`]), the two sources of the
//! cluster state ([`file_source`], [`k8s`]) and the state itself ([`cluster`]), its
//! translation into dataplane tables ([`translate`]), how `xlb run` publishes them and keeps
//! the steering maps in step ([`orchestrate`], [`steer`]), VIP announcement ([`announce`]),
//! address assignment ([`ipam`]), health and metrics ([`http`]) and the tables' display
//! ([`show`]). The `xlb` binary (`main.rs`, `run.rs`) adds the processes' threads, signals,
//! workers and sockets.
#![forbid(unsafe_code)]

pub mod announce;
pub mod cluster;
pub mod config;
pub mod duration;
pub mod file_source;
pub mod http;
pub mod ipam;
pub mod k8s;
pub mod kubeproxy;
pub mod orchestrate;
pub mod show;
pub mod steer;
pub mod translate;

#[cfg(test)]
pub(crate) mod test_support;
