//! Fuzz target: arbitrary bytes as one Ethernet frame through the whole pipeline, twice, on a
//! worker primed with flows of every kind (see `../harness.rs` for the tables and the
//! invariants checked after each packet).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
#[allow(dead_code, reason = "the seed generator is used by the corpus test only")]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::run(harness::tables(), data);
});
