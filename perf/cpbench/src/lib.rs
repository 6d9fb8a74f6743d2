//! xlb control-plane scale benchmark and kube-proxy ruleset generation (work in progress).
