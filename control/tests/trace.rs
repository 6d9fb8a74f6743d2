//! Runs the real `xlb` binary: `xlb trace` replays the packet fixture corpus's pcaps
//! (`dataplane/tests/fixtures/`) through the pipeline and must give each fixture's expected
//! verdict and output frame; `xlb trace flow` names a flow's backend.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
use pcap_file::pcapng::{Block, PcapNgReader};

fn xlb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xlb")).args(args).output().expect("xlb runs")
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xlb-trace-{}-{name}", std::process::id()))
}

fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let mut r = PcapReader::new(std::fs::File::open(path).expect("open pcap")).expect("pcap header");
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        out.push(p.expect("pcap record").data.into_owned());
    }
    out
}

fn write_pcap(path: &Path, frames: &[&Vec<u8>]) {
    let header = PcapHeader { datalink: pcap_file::DataLink::ETHERNET, ..PcapHeader::default() };
    let mut w = PcapWriter::with_header(std::fs::File::create(path).expect("create"), header).expect("header");
    for (i, f) in frames.iter().enumerate() {
        let ts = std::time::Duration::from_millis(1_000 + i as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, f)).expect("write");
    }
}

/// (frame, comment) of each Enhanced Packet Block.
fn read_pcapng(path: &Path) -> Vec<(Vec<u8>, String)> {
    let data = std::fs::read(path).expect("read pcapng");
    let mut r = PcapNgReader::new(data.as_slice()).expect("pcapng header");
    let mut out = Vec::new();
    while let Some(b) = r.next_block() {
        if let Block::EnhancedPacket(p) = b.expect("block") {
            let comment = p
                .options
                .iter()
                .find_map(|o| match o {
                    EnhancedPacketOption::Comment(c) => Some(c.to_string()),
                    _ => None,
                })
                .unwrap_or_default();
            out.push((p.data.into_owned(), comment));
        }
    }
    out
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
/// config. Left out: rows with their own tables, a table change or a clock step, and the
/// NodePort masquerade row, whose expected frames use SNAT ports 1024–2047 where xlb uses
/// 61000–65535.
const STANDARD_ROWS: &[&str] = &[
    "clusterip_dnat_rewrites_destination_and_keeps_client_ip",
    "udp_dnat_and_reply",
    "clusterip_on_an_unknown_port_is_rejected",
    "traffic_not_for_a_vip_passes_to_the_kernel",
    "ttl_one_is_not_forwarded",
    "malformed_l4_to_a_vip_is_dropped_and_to_others_passed",
    "vlan_tagged_frames_keep_their_tag",
];

#[test]
fn trace_replays_the_fixture_corpus_with_the_expected_verdicts_and_frames() {
    let dir = repo("dataplane/tests/fixtures");
    let inputs = read_pcap(&dir.join("inputs.pcap"));
    let expected = read_pcap(&dir.join("expected.pcap"));
    let index = std::fs::read_to_string(dir.join("index.tsv")).expect("index.tsv");
    // row name -> [(record, expected verdict)] in record order.
    let mut rows: Vec<(String, Vec<(usize, String)>)> = Vec::new();
    for line in index.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [rec, row, _what, verdict] = cols[..] else { panic!("index.tsv line {line:?}") };
        let base = row.split_once('/').map_or(row, |(_, b)| b);
        if !STANDARD_ROWS.contains(&base) {
            continue;
        }
        let rec: usize = rec.parse().expect("record number");
        match rows.last_mut() {
            Some((name, recs)) if name == row => recs.push((rec, verdict.to_owned())),
            _ => rows.push((row.to_owned(), vec![(rec, verdict.to_owned())])),
        }
    }
    assert_eq!(rows.len(), 2 * STANDARD_ROWS.len(), "every listed row, v4 and v6: {rows:?}");
    let config = repo("control/tests/data/fixtures-standard.yaml");
    let mut checked = 0;
    for (row, recs) in &rows {
        // Each row starts from empty state, as in the fixture test: one capture per row.
        let input = scratch("in.pcap");
        let output = scratch("out.pcapng");
        write_pcap(&input, &recs.iter().map(|(r, _)| &inputs[*r]).collect::<Vec<_>>());
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
        for (((rec, verdict), t), (frame, comment)) in recs.iter().zip(&traced).zip(&frames) {
            let action = t["action"].as_str().expect("action");
            let what = format!("{row} record {rec}: {t}");
            match verdict.as_str() {
                "Tx" => {
                    assert!(t["port"].as_u64() == Some(0), "{what}");
                    assert_eq!(frame, &expected[*rec], "{what}: the output frame");
                }
                "Pass" => {
                    assert_eq!(action, "pass", "{what}");
                    assert_eq!(frame, &inputs[*rec], "{what}: passed unchanged");
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
    assert_eq!(checked, 24, "records checked");
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
