//! `make bench` report generator (work in progress).

fn main() {}
