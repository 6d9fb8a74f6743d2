//! Fuzz target: the fixed-offset fast parser against the full parser. Wherever the fast parser
//! takes a frame, the full parser must give exactly the same view of it (issue 9).
#![no_main]

use dataplane::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((l3, p)) = wire::parse_fast(data) {
        let (l3_full, _) = wire::ethernet(data).expect("fast parser took a frame the Ethernet parser refuses");
        assert_eq!(l3, l3_full, "family");
        assert_eq!(wire::parse(data), Ok(Some(p)), "fast and full parser disagree");
    }
});
