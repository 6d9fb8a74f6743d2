//! `make bench` report: turns the raw per-trial JSON lines that `perf/bench/run.sh` appends to
//! `perf/results/raw-DATE.jsonl` into `latest.json` (figures and ratios), `latest.md` (tables)
//! and `latest.png` (grouped bar chart), plus dated copies.
//!
//! Raw lines (one JSON object each; unknown fields are kept in the raw file and ignored here):
//!
//! | `kind` | fields read |
//! |---|---|
//! | `run` | `settings` (any JSON object: repeats, seconds, pinning, tool versions…), copied to the report |
//! | `trial` | `path` (`a`..`d`), `profile`, `repeat`, `generator` (`xlb-pktgen`, `trafgen`), `tx_pps`, `rx_pps`, `loss`, `latency_ns` |
//! | `cps` | `path`, `repeat`, `generator` (`wrk`), `requests_per_s` |
//! | `search` | `path`, `profile`, `no_drop_pps` |
//! | `failed` | `path`, `profile`, `repeat`, `reason` |
//!
//! A line without `kind` that has `rx_pps` counts as a `trial`.

pub mod chart;
pub mod markdown;
pub mod raw;
pub mod summary;

pub use raw::{RawRecord, parse_raw};
pub use summary::{Machine, Report, ReportInput, Stats, build_report};

/// The paths compared, in display order: (id, short name, what it is).
pub const PATHS: [(&str, &str, &str); 5] = [
    ("a", "macfwd", "xlb-macfwd: AF_XDP forwarder that rewrites only MACs (the I/O ceiling)"),
    ("b", "xlb", "xlb: AF_XDP load balancer, ClusterIP DNAT with per-flow state"),
    ("c", "nftables", "kernel forwarding with kube-proxy nftables-mode rules (RPS to the forwarder CPU)"),
    ("d", "iptables", "kernel forwarding with kube-proxy iptables-mode rules (RPS to the forwarder CPU)"),
    (
        "e",
        "testpmd",
        "DPDK dpdk-testpmd (Debian dpdk-dev 22.11) on the AF_XDP PMD, MAC forwarding: a second AF_XDP ceiling, not written by us",
    ),
];

/// The packet-rate profiles, in display order (unknown profiles are appended after these).
pub const PROFILES: [(&str, &str); 6] = [
    ("udp64_1flow", "UDP, 64 B frames, 1 flow"),
    ("udp64_1k", "UDP, 64 B frames, 1,000 flows"),
    ("udp64_100k", "UDP, 64 B frames, 100,000 flows"),
    ("tcp64_1k", "TCP ACK-only (established-looking), 64 B, 1,000 flows"),
    ("syn64", "TCP SYN flood, 64 B, every packet a new flow"),
    ("udp512_1k", "UDP, 512 B frames, 1,000 flows"),
];

/// The generator whose trials make the main table.
pub const MAIN_GENERATOR: &str = "xlb-pktgen";

/// Short name of a path id (`b` → `xlb`); the id itself when unknown.
#[must_use]
pub fn path_name(id: &str) -> &str {
    PATHS.iter().find(|p| p.0 == id).map_or(id, |p| p.1)
}
