//! Fuzz target: the fixed-offset fast parser against the full parser. Wherever the fast parser
//! takes a frame, the full parser must give exactly the same view of it (issue 9); and the
//! common shapes' parsers (`parse_fast_v4_tcp`, `parse_fast_v6_tcp`) must give what the fast
//! parser gives for their shape, and nothing for any other frame.
#![no_main]

use dataplane::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((l3, p)) = wire::parse_fast(data) {
        let (l3_full, _) = wire::ethernet(data).expect("fast parser took a frame the Ethernet parser refuses");
        assert_eq!(l3, l3_full, "family");
        assert_eq!(wire::parse(data), Ok(Some(p)), "fast and full parser disagree");
    }
    // The common shape's parser: the fast parser's result for untagged IPv4 TCP, else nothing.
    let common = match wire::parse_fast_frame(data) {
        Some(wire::FastFrame::V4(x)) if x.l3 == 14 && x.proto == wire::proto::TCP => Some(x),
        _ => None,
    };
    assert_eq!(wire::parse_fast_v4_tcp(data), common, "common-shape and fast parser disagree");
    let common6 = match wire::parse_fast_frame(data) {
        Some(wire::FastFrame::V6(x)) if x.l3 == 14 && x.proto == wire::proto::TCP => Some(x),
        _ => None,
    };
    assert_eq!(wire::parse_fast_v6_tcp(data), common6, "IPv6 common-shape and fast parser disagree");
});
