//! The fuzz corpus, replayed on stable so CI checks it without libFuzzer (issue 2: "a normal
//! test replays the corpus"), plus random and mutated frames through the same harness.
//!
//! The harness (`dataplane/fuzz/harness.rs`, shared with the cargo-fuzz target) runs each
//! frame twice through a worker primed with flows of every kind and checks, after every
//! packet: no panic, the verdict is `Tx`/`Pass`/`Drop`, the frame stays in its buffer, `rx ==
//! tx + pass + sum(drops)`, `Pass` leaves the frame unchanged, and a valid input is
//! transmitted with valid checksums.
//!
//! The seed files in `dataplane/fuzz/corpus/pipeline/` are made by `harness::seeds()`;
//! `XLB_BLESS=1 cargo test -p dataplane --test fuzz_corpus` rewrites them. Files the fuzzer
//! added (any other name) are replayed too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use dataplane::process::Verdict;
use proptest::prelude::*;

#[path = "../fuzz/harness.rs"]
mod harness;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/pipeline")
}

/// Every file of the corpus directory, by name.
fn corpus() -> BTreeMap<String, Vec<u8>> {
    let dir = corpus_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn seed_files_match_the_generator() {
    let dir = corpus_dir();
    let bless = std::env::var_os("XLB_BLESS").is_some();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let on_disk = corpus();
    let mut stale = Vec::new();
    for (name, bytes) in seeds() {
        let file = format!("{name}.bin");
        if bless {
            std::fs::write(dir.join(&file), bytes).unwrap();
        } else if on_disk.get(&file) != Some(bytes) {
            stale.push(file);
        }
    }
    assert!(stale.is_empty(), "seed files missing or stale (XLB_BLESS=1 rewrites them): {stale:?}");
}

#[test]
fn every_corpus_file_replays_without_panic_and_with_consistent_counters() {
    let files = corpus();
    assert!(files.len() >= seeds().len(), "corpus has {} files", files.len());
    let t = harness::tables();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, bytes) in &files {
        let [first, second] = std::panic::catch_unwind(|| harness::run(t, bytes))
            .unwrap_or_else(|_| panic!("corpus file {name} failed (see the panic above)"));
        for v in [first, second] {
            let kind = match v {
                Verdict::Tx { .. } => "tx",
                Verdict::Pass => "pass",
                Verdict::Drop(_) => "drop",
                Verdict::Handoff { .. } => unreachable!("the harness rejects Handoff"),
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    // The seeds must reach the real paths, not only the parser's drops.
    assert!(kinds.get("tx").copied().unwrap_or(0) >= 40, "{kinds:?}");
    assert!(kinds.get("pass").copied().unwrap_or(0) >= 2, "{kinds:?}");
    assert!(kinds.get("drop").copied().unwrap_or(0) >= 10, "{kinds:?}");
}

#[test]
fn seeds_take_the_paths_their_names_promise() {
    let t = harness::tables();
    let seeds: BTreeMap<&str, &[u8]> = seeds().iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    let first = |name: &str| harness::run(t, seeds[name])[0];
    for name in [
        "tcp_syn_v4_new",
        "tcp_ack_v4_established",
        "tcp_syn_v4_snat_nodeport",
        "tcp_syn_v4_dsr_ipip",
        "tcp_ack_v4_dsr_ipip_too_big",
        "tcp_syn_v4_no_endpoints_rejected",
        "udp_v4_zero_checksum",
        "sctp_v4_init",
        "udp_later_fragment_v4_tracked",
        "tcp_syn_v4_vlan",
        "tcp_syn_v6_dsr_ip6ip6",
        "tcp_synack_reply_v4",
        "tcp_synack_reply_v4_snat",
        "tcp_synack_reply_v6",
        "icmp_frag_needed_quoting_reply_v4",
        "icmp_port_unreachable_from_backend_v4",
        "icmp6_packet_too_big_quoting_reply_v6",
    ] {
        assert!(matches!(first(name), Verdict::Tx { .. }), "{name}: {:?}", first(name));
    }
    for name in ["arp_request", "tcp_syn_v4_not_ours"] {
        assert_eq!(first(name), Verdict::Pass, "{name}");
    }
    for name in ["truncated_tcp_v4_6", "udp_later_fragment_v4_untracked", "tcp_syn_v4_source_range_denied"] {
        assert!(matches!(first(name), Verdict::Drop(_)), "{name}: {:?}", first(name));
    }
}

/// Every seed, in batches through a primed worker, gives the verdicts and bytes that the same
/// frames one at a time give on another primed worker. The seeds are of every shape (IPv4 and
/// IPv6, TCP and UDP, tagged, fragments, ICMP, not IP); batches of 64, 16 and 5 frames in
/// rotated orders start and end at different shapes: whatever the mix, the batch stages keep
/// the meaning of one packet at a time.
#[test]
fn seeds_in_batches_give_what_one_at_a_time_gives() {
    let t = harness::tables();
    let frames: Vec<&[u8]> = seeds().iter().map(|(_, b)| b.as_slice()).collect();
    assert!(frames.len() >= 40, "only {} seeds", frames.len());
    for (size, rot) in [(64, 0), (64, 20), (16, 0), (16, 1), (16, 7), (5, 3), (5, 41)] {
        let mut order = frames.clone();
        let n = order.len();
        order.rotate_left(rot % n);
        let mut one = harness::primed(t);
        let expect: Vec<(Verdict, Vec<u8>)> = order.iter().map(|f| harness::process_checked(&mut one, t, f)).collect();
        let mut batched = harness::primed(t);
        let got: Vec<(Verdict, Vec<u8>)> =
            order.chunks(size).flat_map(|c| harness::process_batch_checked(&mut batched, t, c)).collect();
        assert_eq!(got.len(), expect.len());
        for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
            assert_eq!(g, e, "batches of {size}, rotation {rot}, frame {i}");
        }
    }
}

/// The generated seeds, made once (making them runs a few workers).
fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(harness::seeds)
}

/// A seed changed by `edits` (offset, xor mask) and cut or extended to `len`.
fn mutate(seed: &[u8], edits: &[(usize, u8)], len: usize) -> Vec<u8> {
    let mut f = seed.to_vec();
    for &(at, x) in edits {
        if !f.is_empty() {
            let i = at % f.len();
            f[i] ^= x;
        }
    }
    f.resize(len, 0);
    f
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_frames_do_not_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        harness::run(harness::tables(), &bytes);
    }

    #[test]
    fn random_bytes_after_a_valid_ethernet_and_ip_start_do_not_panic(
        v6 in any::<bool>(),
        rest in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        // Ethernet + the first byte of an IP header, so most inputs get past the L2 parser.
        let mut f = vec![2, 0, 0, 0, 0, 0xfe, 2, 0, 0, 0, 0, 1];
        f.extend_from_slice(if v6 { &[0x86, 0xdd, 0x60] } else { &[0x08, 0x00, 0x45] });
        f.extend_from_slice(&rest);
        harness::run(harness::tables(), &f);
    }

    #[test]
    fn mutated_seeds_do_not_panic(
        which in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<usize>(), 1..=255u8), 0..6),
        extra in -40i32..40,
    ) {
        let (_, seed) = &seeds()[which.index(seeds().len())];
        let len = usize::try_from(i32::try_from(seed.len()).unwrap_or(i32::MAX).saturating_add(extra)).unwrap_or(0);
        harness::run(harness::tables(), &mutate(seed, &edits, len));
    }
}
