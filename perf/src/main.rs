//! xlb benchmarks and packet generator.

fn main() {}
