//! The steering program's benchmark script (`perf/steer/run.sh`, `make bench-steer`) in a
//! short form: it builds the program, loads it under `/sys/fs/bpf` (and removes it again),
//! and prints one figure per frame under the names docs/benchmarks.md records. Needs root,
//! clang and bpftool; without root it prints why and passes without running (CI runs it as
//! root). Times are not checked: the figures come from `make bench-steer`.

use std::process::Command;

use xlb_testkit::skip_without_root;

const FRAMES: [&str; 5] = ["service", "snat_reply", "dnat_reply", "pass", "non_ip"];

#[test]
fn steer_bench_prints_one_figure_per_frame_and_leaves_nothing_pinned() {
    if skip_without_root("steer_bench") {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/steer/run.sh");
    let out = Command::new("bash")
        .arg(script)
        .env("STEER_REPEAT", "20000")
        .env("STEER_ROUNDS", "1")
        .output()
        .expect("run perf/steer/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "run.sh failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for f in FRAMES {
        let name = format!("steer_{f}_ns_per_packet");
        let line = stdout.lines().find(|l| l.split_whitespace().next() == Some(name.as_str()));
        let Some(line) = line else { panic!("no {name} line in: {stdout}") };
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 3, "NAME VALUE UNIT: {line}");
        assert!(fields[1].parse::<u64>().is_ok(), "a whole number of ns: {line}");
        assert_eq!(fields[2], "ns", "{line}");
    }
    let left: Vec<_> = std::fs::read_dir("/sys/fs/bpf")
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(!left.iter().any(|n| n.starts_with("xlb-steer-bench-")), "pins left behind: {left:?}");
}
