//! `xlb`: the load balancer binary.

fn main() {}
