//! xlb control plane: the configuration file, the translation of Kubernetes objects into
//! dataplane tables, and their display. The `xlb` binary (`main.rs`) wires these together;
//! the Kubernetes source will call the same [`translate::build_spec`].
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
