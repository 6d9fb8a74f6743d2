//! End-to-end tests for xlb on network namespaces.
