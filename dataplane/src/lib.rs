//! xlb dataplane.
