//! Runs the real `xlb` binary: `xlb trace` replays the packet fixture corpus's pcaps
//! (`dataplane/tests/fixtures/`) through the pipeline and must give each fixture's expected
//! verdict and output frame; `xlb trace flow` names a flow's backend.
//!
//! Replayed: the rows of the corpus's standard setup ([`STANDARD_ROWS`], config
//! `tests/data/fixtures-standard.yaml`) and the rows with their own setups that `xlb trace`
//! can express ([`OWN_SETUP_ROWS`]: one config file per setup in `tests/data/fixtures-*.yaml`,
//! clock steps as the capture's timestamps). Not replayed, each with the reason:
//! [`NOT_REPLAYED`]. A test requires every row of `index.tsv` to be in exactly one list.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};

fn xlb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xlb")).args(args).output().expect("xlb runs")
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// A temporary path unique to this process and call (the tests run in parallel threads).
fn scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("xlb-trace-{}-{n}-{name}", std::process::id()))
}

fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let mut r = PcapReader::new(std::fs::File::open(path).expect("open pcap")).expect("pcap header");
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        out.push(p.expect("pcap record").data.into_owned());
    }
    out
}

/// Writes `frames` 1 ms apart from 1 s.
fn write_pcap(path: &Path, frames: &[&Vec<u8>]) {
    let at: Vec<_> =
        frames.iter().enumerate().map(|(i, f)| (std::time::Duration::from_millis(1_000 + i as u64), *f)).collect();
    write_pcap_at(path, &at);
}

/// Writes each frame with its timestamp (microsecond pcap, the `pcap-file` crate).
fn write_pcap_at(path: &Path, frames: &[(std::time::Duration, &Vec<u8>)]) {
    let header = PcapHeader { datalink: pcap_file::DataLink::ETHERNET, ..PcapHeader::default() };
    let mut w = PcapWriter::with_header(std::fs::File::create(path).expect("create"), header).expect("header");
    for (ts, f) in frames {
        w.write_packet(&PcapPacket::new(*ts, f.len() as u32, f)).expect("write");
    }
}

/// (frame, comment) of each Enhanced Packet Block ([`xlb_testkit::read_pcapng`]).
fn read_pcapng(path: &Path) -> Vec<(Vec<u8>, String)> {
    xlb_testkit::read_pcapng(path).expect("read pcapng")
}

/// `SnatUntracked` → `snat_untracked` (`DropReason::name`).
fn snake(camel: &str) -> String {
    let mut s = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

/// Fixture rows that use the corpus's standard setup (`spec(f, vec![])` in
/// dataplane/tests/fixtures.rs), which `tests/data/fixtures-standard.yaml` states as an xlb
/// config; their output frames are compared byte for byte. More rows, with their own
/// setups, are in [`OWN_SETUP_ROWS`]; those `xlb trace` cannot express in [`NOT_REPLAYED`].
const STANDARD_ROWS: &[&str] = &[
    "clusterip_dnat_rewrites_destination_and_keeps_client_ip",
    "udp_dnat_and_reply",
    "clusterip_on_an_unknown_port_is_rejected",
    "traffic_not_for_a_vip_passes_to_the_kernel",
    "ttl_one_is_answered_with_time_exceeded_from_the_vip",
    "malformed_l4_to_a_vip_is_dropped_and_to_others_passed",
    "vlan_tagged_frames_keep_their_tag",
    "a_backends_syn_ack_on_the_reply_tuple_of_a_closing_flow_is_the_kernels_and_the_flow_is_forgotten",
];

/// How a replayed row's transmitted frames are checked.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Frames {
    /// Byte for byte against the fixture's expected frame.
    Exact,
    /// Masqueraded: xlb's SNAT ports are 61000–65535 (`run::SNAT_PORTS`) where the fixtures
    /// use 1024–2047, so the frame differs in the port and checksums; its length and the
    /// action `snat` are checked.
    SnatPort,
}

/// Further fixture rows `xlb trace` expresses: (row, its setup as an xlb config in
/// `tests/data/`, how its frames are checked). Clock steps are the capture's timestamps.
const OWN_SETUP_ROWS: &[(&str, &str, Frames)] = &[
    ("ttl_one_on_the_direct_route_is_answered_with_time_exceeded_from_the_vip", "fixtures-maglev.yaml", Frames::Exact),
    ("a_replys_later_fragment_whose_hop_limit_runs_out_is_dropped_unanswered", "fixtures-standard.yaml", Frames::Exact),
    ("hairpin_backend_reaching_its_own_service_is_masqueraded", "fixtures-standard.yaml", Frames::SnatPort),
    ("icmp_too_big_about_a_reply_reaches_the_backend_that_owns_the_flow", "fixtures-standard.yaml", Frames::Exact),
    (
        "icmp_error_about_a_dnat_flows_packet_to_its_backend_reaches_the_client_translated",
        "fixtures-standard.yaml",
        Frames::Exact,
    ),
    (
        "icmp_error_with_a_bad_checksum_is_dropped_not_forwarded_under_a_fresh_checksum",
        "fixtures-standard.yaml",
        Frames::Exact,
    ),
    ("no_port_unreachable_is_sent_about_a_packet_from_no_single_host", "fixtures-standard.yaml", Frames::Exact),
    ("icmp_error_quoting_a_later_fragment_is_not_translated", "fixtures-standard.yaml", Frames::Exact),
    ("fragments_follow_their_first_fragment", "fixtures-standard.yaml", Frames::Exact),
    ("a_dnat_replys_later_fragments_follow_its_first_fragment_to_the_client", "fixtures-standard.yaml", Frames::Exact),
    ("a_later_fragment_of_an_echo_request_to_a_vip_goes_to_the_kernel", "fixtures-standard.yaml", Frames::Exact),
    ("a_packet_from_a_martian_source_starts_no_flow", "fixtures-standard.yaml", Frames::Exact),
    (
        "datagrams_behind_a_hop_by_hop_header_are_dnatted_whole_and_in_fragments",
        "fixtures-standard.yaml",
        Frames::Exact,
    ),
    (
        "fragments_with_destination_options_after_the_fragment_header_follow_their_first_fragment",
        "fixtures-standard.yaml",
        Frames::Exact,
    ),
    ("udp_v6_dnat_whose_checksum_sums_to_zero_carries_it_as_all_ones", "fixtures-standard.yaml", Frames::Exact),
    (
        "a_udp_first_fragment_whose_rewritten_checksum_sums_to_zero_carries_it_as_all_ones",
        "fixtures-standard.yaml",
        Frames::Exact,
    ),
    ("dsr_l2_rewrites_only_the_macs_and_ttl", "fixtures-dsr-l2.yaml", Frames::Exact),
    ("dsr_ipip_encapsulates_to_the_backend", "fixtures-dsr-ipip.yaml", Frames::Exact),
    ("dsr_ipip_too_big_with_df_answers_fragmentation_needed", "fixtures-dsr-ipip.yaml", Frames::Exact),
    ("service_without_endpoints_rejects_with_port_unreachable", "fixtures-no-endpoints.yaml", Frames::Exact),
    ("local_policy_without_local_endpoints_drops", "fixtures-local-no-endpoints.yaml", Frames::Exact),
    ("source_ranges_admit_listed_clients_and_drop_others", "fixtures-source-ranges.yaml", Frames::Exact),
    ("client_ip_affinity_keeps_a_client_on_one_backend_until_timeout", "fixtures-affinity.yaml", Frames::Exact),
    ("client_ip_affinity_timer_restarts_with_each_new_connection", "fixtures-affinity.yaml", Frames::Exact),
    ("sctp_dnat_recomputes_crc32c", "fixtures-sctp.yaml", Frames::Exact),
    (
        "sctp_first_fragment_whose_port_dnat_changes_is_dropped_as_its_crc32c_cannot_follow",
        "fixtures-sctp.yaml",
        Frames::Exact,
    ),
    (
        "an_established_flow_keeps_its_reply_tuple_and_a_new_flow_with_the_same_one_is_dropped",
        "fixtures-two-frontends.yaml",
        Frames::Exact,
    ),
    ("a_new_flow_takes_the_reply_tuple_of_a_flow_not_yet_established", "fixtures-two-frontends.yaml", Frames::Exact),
];

/// Fixture rows `xlb trace` cannot express (one config, one worker, no kernel routes):
/// - nodeport_masquerade_rewrites_source_to_snat_address_and_worker_port: its replies go to
///   SNAT port 1024; xlb's SNAT ports are 61000–65535 and not configurable.
/// - clusterip_from_outside_the_cluster_cidr_is_masqueraded_from_inside_keeps_the_client_ip:
///   a reply to SNAT port 1024, as above.
/// - icmp_error_from_the_backend_side_about_a_snat_flow_reaches_the_client: the error quotes
///   SNAT port 1024, as above.
/// - backend_without_a_route_is_a_counted_drop_and_gets_no_conntrack_entry: needs kernel
///   routes (`TablesSpec::kernel_routes`); `xlb trace` reads no routing table.
/// - flows_to_a_backend_behind_a_multipath_route_are_spread_over_its_paths_and_keep_theirs,
///   and its Maglev and random twins: a multipath kernel route; a config's `routes` have one
///   gateway each.
/// - backend_behind_the_kernel_is_handed_to_the_kernel_unmasqueraded_and_its_reply_returns: a
///   kernel route leaving through an interface xlb does not serve; none offline.
/// - tcp_flow_to_a_removed_backend_gets_a_reset: the tables change between steps; a trace has
///   one config.
/// - udp_flow_to_a_removed_backend_is_rebalanced_at_once: a table change, as above.
/// - flow_keeps_its_backend_when_the_external_frontend_merges_into_the_internal_spec: a table
///   change.
/// - flow_keeps_its_backend_when_the_external_frontend_splits_from_the_internal_spec: a table
///   change.
/// - terminating_serving_backend_keeps_its_flows_and_gets_no_new_ones: a table change.
/// - new_flow_rate_guard_drops_flows_over_the_rate: a guard of 1 new flow/s; the rate guard
///   is not configurable (`xlb run` sets none).
/// - full_conntrack_refuses_new_flows_but_keeps_existing_ones: a one-flow table; xlb's
///   conntrack holds at least 1,024 flows per worker.
/// - syn_on_a_table_full_of_unestablished_flows_evicts_the_oldest_like_early_drop: a one-flow
///   table, as above.
/// - syn_answered_by_the_backend_is_still_evictable_until_the_clients_ack: a one-flow table.
/// - a_syn_on_the_tuple_of_a_closing_flow_whose_backend_left_is_a_new_flow_to_a_backend_that_is_there:
///   a table change.
/// - icmp_error_about_a_flow_of_another_worker_is_handed_to_it: two workers; a trace runs one.
/// - a_later_fragment_of_a_series_this_worker_has_not_seen_goes_to_the_next_unless_to_a_vip:
///   two workers, as above.
/// - a_full_fragment_table_forgets_its_oldest_series_for_a_new_one: a table of two series;
///   xlb's holds 8,192 per worker and family.
/// - dsr_ipip_later_fragment_too_big_for_the_encapsulation_is_dropped_not_sent_oversized: a
///   UDP service in IPIP DSR mode, a setup none of `tests/data`'s configs has.
/// - icmp_error_about_a_masqueraded_flow_quotes_the_snat_address_the_flow_has: a table change.
/// - a_node_address_that_is_also_an_external_ip_passes_the_nodes_own_fragments_from_the_start:
///   an external IP on the node's own address, a setup none of `tests/data`'s configs has;
///   `..._after_a_change`: a table change.
/// - sctp_fragments_whose_ports_stay_keep_their_crc32c_and_follow_their_first_fragment: an
///   SCTP service whose backend port is its own, a setup none of `tests/data`'s configs has.
/// - a_packet_larger_than_the_backends_smaller_port_is_answered_with_fragmentation_needed and
///   a_reply_larger_than_the_clients_smaller_port_is_answered_with_fragmentation_needed: two
///   ports of different MTUs, and frames sent on the second; `xlb trace` has one port.
const NOT_REPLAYED: &[&str] = &[
    "nodeport_masquerade_rewrites_source_to_snat_address_and_worker_port",
    "clusterip_from_outside_the_cluster_cidr_is_masqueraded_from_inside_keeps_the_client_ip",
    "icmp_error_from_the_backend_side_about_a_snat_flow_reaches_the_client",
    "backend_without_a_route_is_a_counted_drop_and_gets_no_conntrack_entry",
    "flows_to_a_backend_behind_a_multipath_route_are_spread_over_its_paths_and_keep_theirs",
    "maglev_flows_to_a_backend_behind_a_multipath_route_are_spread_over_its_paths",
    "random_flows_to_a_backend_behind_a_multipath_route_are_spread_over_its_paths",
    "backend_behind_the_kernel_is_handed_to_the_kernel_unmasqueraded_and_its_reply_returns",
    "tcp_flow_to_a_removed_backend_gets_a_reset",
    "udp_flow_to_a_removed_backend_is_rebalanced_at_once",
    "flow_keeps_its_backend_when_the_external_frontend_merges_into_the_internal_spec",
    "flow_keeps_its_backend_when_the_external_frontend_splits_from_the_internal_spec",
    "terminating_serving_backend_keeps_its_flows_and_gets_no_new_ones",
    "client_ip_affinity_follows_a_changed_timeout_at_once",
    "client_ip_affinity_does_not_send_new_connections_to_a_terminating_backend",
    "new_flow_rate_guard_drops_flows_over_the_rate",
    "full_conntrack_refuses_new_flows_but_keeps_existing_ones",
    "syn_on_a_table_full_of_unestablished_flows_evicts_the_oldest_like_early_drop",
    "syn_answered_by_the_backend_is_still_evictable_until_the_clients_ack",
    "a_syn_on_the_tuple_of_a_closing_flow_whose_backend_left_is_a_new_flow_to_a_backend_that_is_there",
    "a_node_address_that_is_also_an_external_ip_passes_the_nodes_own_fragments_from_the_start",
    "a_node_address_that_is_also_an_external_ip_passes_the_nodes_own_fragments_after_a_change",
    "icmp_error_about_a_flow_of_another_worker_is_handed_to_it",
    "a_later_fragment_of_a_series_this_worker_has_not_seen_goes_to_the_next_unless_to_a_vip",
    "a_full_fragment_table_forgets_its_oldest_series_for_a_new_one",
    "icmp_error_about_a_masqueraded_flow_quotes_the_snat_address_the_flow_has",
    "dsr_ipip_later_fragment_too_big_for_the_encapsulation_is_dropped_not_sent_oversized",
    "sctp_fragments_whose_ports_stay_keep_their_crc32c_and_follow_their_first_fragment",
    "a_packet_larger_than_the_backends_smaller_port_is_answered_with_fragmentation_needed",
    "a_reply_larger_than_the_clients_smaller_port_is_answered_with_fragmentation_needed",
];

/// One step of a fixture row, from `index.tsv`.
#[derive(Debug)]
struct Rec {
    /// Record number in inputs.pcap / expected.pcap.
    rec: usize,
    /// `Tx`, `ToKernel`, `Pass` or `Drop(Reason)`.
    verdict: String,
    /// Seconds the fixture's clock moves before this step.
    advance_s: u64,
    /// Whether the fixture's tables change before this step.
    retable: bool,
}

/// The fixture rows of `index.tsv` in order: (`v4/name` or `v6/name`, its steps).
fn index_rows() -> Vec<(String, Vec<Rec>)> {
    let index = std::fs::read_to_string(repo("dataplane/tests/fixtures/index.tsv")).expect("index.tsv");
    let mut rows: Vec<(String, Vec<Rec>)> = Vec::new();
    for line in index.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [rec, row, _what, verdict, advance_s, retable] = cols[..] else { panic!("index.tsv line {line:?}") };
        let r = Rec {
            rec: rec.parse().expect("record number"),
            verdict: verdict.to_owned(),
            advance_s: advance_s.parse().expect("advance_s"),
            retable: retable == "1",
        };
        match rows.last_mut() {
            Some((name, recs)) if name == row => recs.push(r),
            _ => rows.push((row.to_owned(), vec![r])),
        }
    }
    assert!(!rows.is_empty(), "index.tsv lists no rows: every test over them would check nothing");
    rows
}

/// `v4/name` → `name`.
fn base(row: &str) -> &str {
    row.split_once('/').map_or(row, |(_, b)| b)
}

/// Replays each row through `xlb trace --config tests/data/CONFIG` (one capture per row, so
/// each starts from empty state as in the fixture test; the steps 1 ms apart plus each step's
/// clock step) and checks every step's verdict and output frame. Returns the records checked.
fn replay(rows: &[(String, Vec<Rec>)], config_of: impl Fn(&str) -> Option<(&'static str, Frames)>) -> usize {
    let dir = repo("dataplane/tests/fixtures");
    let inputs = read_pcap(&dir.join("inputs.pcap"));
    let expected = read_pcap(&dir.join("expected.pcap"));
    let mut checked = 0;
    for (row, recs) in rows {
        let Some((config, check)) = config_of(base(row)) else { continue };
        assert!(recs.iter().all(|r| !r.retable), "{row}: a table change cannot be replayed");
        let config = repo(&format!("control/tests/data/{config}"));
        let input = scratch("in.pcap");
        let output = scratch("out.pcapng");
        let mut at_ms = 1_000;
        let frames: Vec<(std::time::Duration, &Vec<u8>)> = recs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                at_ms += r.advance_s * 1_000 + u64::from(i > 0);
                (std::time::Duration::from_millis(at_ms), &inputs[r.rec])
            })
            .collect();
        write_pcap_at(&input, &frames);
        let out = xlb(&[
            "trace",
            "--config",
            config.to_str().unwrap(),
            "--in",
            input.to_str().unwrap(),
            "--out",
            output.to_str().unwrap(),
            "--json",
            "--mac",
            "02:00:00:00:00:fe",
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let frames = if out.status.success() { read_pcapng(&output) } else { Vec::new() };
        let _ = std::fs::remove_file(&input);
        let _ = std::fs::remove_file(&output);
        assert!(out.status.success(), "{row}: {}", String::from_utf8_lossy(&out.stderr));
        let traced: Vec<serde_json::Value> =
            stdout.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect();
        assert_eq!(traced.len(), recs.len(), "{row}: {stdout}");
        assert_eq!(frames.len(), recs.len(), "{row}");
        for ((r, t), (frame, comment)) in recs.iter().zip(&traced).zip(&frames) {
            let action = t["action"].as_str().expect("action");
            let what = format!("{row} record {}: {t}", r.rec);
            match r.verdict.as_str() {
                "Tx" => {
                    assert!(t["port"].as_u64() == Some(0), "{what}");
                    // A frame with TTL / hop limit 1 that is transmitted is answered with time
                    // exceeded (the TTL rows), and `xlb trace` says so.
                    let ttl = inputs[r.rec].get(if inputs[r.rec].get(12..14) == Some(&[0x86, 0xdd]) { 21 } else { 22 });
                    if ttl == Some(&1) {
                        assert_eq!(action, "time_exceeded", "{what}");
                    }
                    match check {
                        Frames::Exact => assert_eq!(frame, &expected[r.rec], "{what}: the output frame"),
                        Frames::SnatPort => {
                            assert_eq!(action, "snat", "{what}");
                            assert_eq!(frame.len(), expected[r.rec].len(), "{what}: the output frame's length");
                        }
                    }
                }
                "Pass" => {
                    assert_eq!(action, "pass", "{what}");
                    assert_eq!(frame, &inputs[r.rec], "{what}: passed unchanged");
                }
                v => {
                    let reason = v.strip_prefix("Drop(").and_then(|r| r.strip_suffix(')')).expect("Drop(reason)");
                    assert_eq!(action, "drop", "{what}");
                    assert_eq!(t["drop_reason"].as_str(), Some(snake(reason).as_str()), "{what}");
                }
            }
            assert!(comment.starts_with("xlb: #") && comment.contains(action), "{what}: comment {comment:?}");
            checked += 1;
        }
    }
    checked
}

#[test]
fn trace_replays_the_fixture_corpus_with_the_expected_verdicts_and_frames() {
    let rows = index_rows();
    let listed = rows.iter().filter(|(row, _)| STANDARD_ROWS.contains(&base(row))).count();
    assert_eq!(listed, 2 * STANDARD_ROWS.len(), "every listed row, v4 and v6");
    let checked = replay(&rows, |b| STANDARD_ROWS.contains(&b).then_some(("fixtures-standard.yaml", Frames::Exact)));
    assert_eq!(checked, 48, "records checked");
}

#[test]
fn trace_replays_the_fixture_rows_with_their_own_setups_and_clock_steps() {
    let rows = index_rows();
    let own = |b: &str| OWN_SETUP_ROWS.iter().find(|(r, ..)| *r == b).map(|(_, c, f)| (*c, *f));
    let checked = replay(&rows, own);
    // Every listed row is in the corpus (the DSR too-big row, the ICMP error quoting a later
    // fragment, the DNAT reply's and the echo request's fragments and the SCTP fragment row
    // only for IPv4, the Destination Options and Hop-by-Hop rows, the two UDP checksum rows and
    // the reply's later fragment whose hop limit runs out only for IPv6, the others for both
    // families), and its clock steps are replayed (the
    // affinity rows' 11 s and 6 s).
    let replayed: Vec<&str> = rows.iter().map(|(r, _)| r.as_str()).filter(|r| own(base(r)).is_some()).collect();
    assert_eq!(replayed.len(), 2 * OWN_SETUP_ROWS.len() - 10, "{replayed:?}");
    let steps: usize = rows.iter().filter(|(r, _)| own(base(r)).is_some()).map(|(_, recs)| recs.len()).sum();
    assert_eq!(checked, steps);
    assert_eq!(checked, 116, "records checked");
    assert!(rows.iter().filter(|(r, _)| own(base(r)).is_some()).any(|(_, recs)| recs.iter().any(|r| r.advance_s > 0)));
}

#[test]
fn every_fixture_row_is_replayed_or_says_why_not() {
    for (row, recs) in index_rows() {
        let b = base(&row);
        let lists =
            [STANDARD_ROWS.contains(&b), OWN_SETUP_ROWS.iter().any(|(r, ..)| *r == b), NOT_REPLAYED.contains(&b)];
        assert_eq!(lists.iter().filter(|x| **x).count(), 1, "{row} must be in exactly one list: {lists:?}");
        if recs.iter().any(|r| r.retable) {
            assert!(NOT_REPLAYED.contains(&b), "{row} changes tables");
        }
    }
}

#[test]
fn trace_reports_conntrack_frontend_and_backend_of_a_dnat_flow() {
    let dir = repo("dataplane/tests/fixtures");
    let inputs = read_pcap(&dir.join("inputs.pcap"));
    // Records 0-2: SYN to the VIP, the backend's SYN-ACK, the client's ACK (index.tsv).
    let input = scratch("dnat.pcap");
    write_pcap(&input, &[&inputs[0], &inputs[1], &inputs[2]]);
    let config = repo("control/tests/data/fixtures-standard.yaml");
    let out = xlb(&["trace", "--config", config.to_str().unwrap(), "--in", input.to_str().unwrap()]);
    let _ = std::fs::remove_file(&input);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "#1 tcp 10.0.0.1:40000 -> 10.96.0.10:80 frontend=default/web:http ClusterIP ct=new backend=10.1.0.11:8080 dnat port 0 events=new_flow",
            "#2 tcp 10.1.0.11:8080 -> 10.0.0.1:40000 frontend=- ct=hit backend=10.1.0.11:8080 reply port 0",
            "#3 tcp 10.0.0.1:40000 -> 10.96.0.10:80 frontend=default/web:http ClusterIP ct=hit backend=10.1.0.11:8080 dnat port 0",
        ]
    );
}

#[test]
fn trace_flow_names_the_backend_of_a_new_flow_and_refuses_bad_input() {
    let config = repo("control/tests/data/fixtures-standard.yaml");
    let c = config.to_str().unwrap();
    let out = xlb(&["trace", "flow", "10.0.0.7:1234", "10.96.0.10:80/tcp", "--config", c]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.contains("ct=new backend=10.1.0.11:8080 dnat"), "{line}");
    // `random` is not a consistent scheduler: the answer says so.
    assert!(String::from_utf8_lossy(&out.stderr).contains("uses `random`"), "{}", String::from_utf8_lossy(&out.stderr));
    let v6 = xlb(&["trace", "flow", "[fd00::7]:53", "[fd96::10]:53/udp", "--config", c, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&v6.stdout).expect("JSON");
    assert_eq!(j["backend"], "[fd01::11]:8080");
    assert_eq!(j["action"], "dnat");
    let none = xlb(&["trace", "flow", "10.0.0.7:1234", "10.96.0.10:81/tcp", "--config", c, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&none.stdout).expect("JSON");
    assert_eq!(j["action"], "reject", "no frontend on :81: kube-proxy rejects");
    assert!(!xlb(&["trace", "flow", "10.0.0.7:1234", "10.96.0.10:80", "--config", c]).status.success());
    assert!(!xlb(&["trace", "flow", "10.0.0.7:1234", "[fd96::10]:80/tcp", "--config", c]).status.success());
    assert!(!xlb(&["trace", "flow", "10.0.0.7:1234", "10.96.0.10:80/icmp", "--config", c]).status.success());
}

#[test]
fn trace_refuses_a_capture_that_is_not_ethernet_or_not_a_capture() {
    let config = repo("control/tests/data/fixtures-standard.yaml");
    let raw = scratch("raw.pcap");
    let header = PcapHeader { datalink: pcap_file::DataLink::RAW, ..PcapHeader::default() };
    let mut w = PcapWriter::with_header(std::fs::File::create(&raw).unwrap(), header).unwrap();
    w.write_packet(&PcapPacket { timestamp: Default::default(), orig_len: 4, data: Cow::Borrowed(&[0x45, 0, 0, 4]) })
        .unwrap();
    drop(w);
    let junk = scratch("junk.pcap");
    std::fs::write(&junk, b"not a capture at all").unwrap();
    let a = xlb(&["trace", "--config", config.to_str().unwrap(), "--in", raw.to_str().unwrap()]);
    let b = xlb(&["trace", "--config", config.to_str().unwrap(), "--in", junk.to_str().unwrap()]);
    let _ = std::fs::remove_file(&raw);
    let _ = std::fs::remove_file(&junk);
    assert!(!a.status.success());
    assert!(String::from_utf8_lossy(&a.stderr).contains("Ethernet"), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(!b.status.success());
    assert!(
        String::from_utf8_lossy(&b.stderr).contains("neither pcap nor pcapng"),
        "{}",
        String::from_utf8_lossy(&b.stderr)
    );
}

#[test]
fn trace_output_reads_back_as_input_with_the_same_timestamps() {
    let dir = repo("dataplane/tests/fixtures");
    let inputs = read_pcap(&dir.join("inputs.pcap"));
    let config = repo("control/tests/data/fixtures-standard.yaml");
    let (input, first, second) = (scratch("rt.pcap"), scratch("rt1.pcapng"), scratch("rt2.pcapng"));
    // A SYN to the VIP and SSH to the node (passed): written at 1.000 s and 1.001 s.
    write_pcap(&input, &[&inputs[0], &inputs[20]]);
    let run = |inp: &Path, out: &Path| {
        xlb(&[
            "trace",
            "--config",
            config.to_str().unwrap(),
            "--in",
            inp.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--json",
        ])
    };
    let a = run(&input, &first);
    let b = run(&first, &second);
    let frames = read_pcapng(&second);
    for p in [&input, &first, &second] {
        let _ = std::fs::remove_file(p);
    }
    assert!(a.status.success() && b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let times = |o: &Output| -> Vec<f64> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["time_s"].as_f64().unwrap())
            .collect()
    };
    assert_eq!(times(&a), [1.0, 1.001]);
    assert_eq!(times(&b), [1.0, 1.001], "pcapng written with if_tsresol 9 reads back in nanoseconds");
    assert_eq!(frames.len(), 2);
}
