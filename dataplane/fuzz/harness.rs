//! The pipeline fuzz harness, shared by the cargo-fuzz target (`fuzz_targets/pipeline.rs`)
//! and the corpus replay test (`dataplane/tests/fuzz_corpus.rs`), both of which include this
//! file with `#[path]`.
//!
//! One fixed table set ([`spec`]) covers every forwarding path: DNAT (TCP, UDP, SCTP),
//! SNAT (a masqueraded NodePort), DSR by IPIP and IP6IP6, L2 DSR, ClientIP affinity, a
//! service without endpoints (reject), `loadBalancerSourceRanges`, a routed backend, and
//! IPv6. Each input gets a fresh worker ([`primed`]) that has already seen a few flows
//! ([`priming_frames`]) so replies, ICMP errors and later fragments in the input can find
//! state; the input is then processed as one Ethernet frame, twice (the second time it may
//! hit the conntrack entry the first one made), in a buffer with headroom and tailroom, then
//! both again in one batch at headroom 0 (the AF_XDP workers' layout) through a worker in the
//! same state, which must give the same verdicts and bytes.
//!
//! [`run`] checks, after every packet:
//! - the verdict is `Tx` (on an existing port), `Pass` or `Drop` — never `Handoff` with one
//!   worker;
//! - the frame still lies inside the buffer;
//! - the counters add up: `rx == tx + pass + sum(drops)`;
//! - `Pass` leaves the frame byte-for-byte unchanged;
//! - a transmitted frame made from an input whose checksums were all correct has correct
//!   checksums ([`build::verify`]): incremental updates must equal a full recompute.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use dataplane::addr::Cidr;
use dataplane::build::{self, Frame, IpOpts, icmp_message, sctp_packet, tcp_segment, udp_datagram};
use dataplane::nat::Packet;
use dataplane::process::{Pipeline, PipelineConfig, Verdict};
use dataplane::tables::{
    BackendSpec, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, NeighbourSpec, PortSpec, RouteSpec,
    Scheduler, ServiceSpec, TableBuilder, Tables, TablesSpec,
};
use dataplane::wire::{proto, tcp_flags};

/// Bytes before the frame (room for an IPIP / IP6IP6 header).
pub(crate) const HEADROOM: usize = 128;
/// Bytes after the frame (room for generated ICMP errors).
pub(crate) const TAILROOM: usize = 256;
/// Longest input used as a frame; longer inputs are cut (a jumbo frame is 9,018 bytes).
pub(crate) const MAX_FRAME: usize = 9_018;
/// The worker clock, in milliseconds.
pub(crate) const NOW_MS: u64 = 10_000;
/// Scheduler seed of every worker: the same input always takes the same path.
pub(crate) const SEED: u64 = 0x00f0_2200;

/// Client of the primed flows.
pub(crate) const CLIENT4: [u8; 4] = [10, 0, 0, 1];
/// A router on the client side (sends ICMP errors about replies).
pub(crate) const ROUTER4: [u8; 4] = [10, 0, 0, 200];
/// ClusterIP of the DNAT services (TCP 80, UDP 53, SCTP 3868).
pub(crate) const VIP4: [u8; 4] = [10, 96, 0, 10];
/// ClusterIP of the ClientIP-affinity service (TCP 443).
pub(crate) const AFFINITY4: [u8; 4] = [10, 96, 0, 20];
/// ClusterIP of the service without endpoints (TCP 80).
pub(crate) const EMPTY4: [u8; 4] = [10, 96, 0, 30];
/// ClusterIP of the L2 DSR service (UDP 514).
pub(crate) const L2DSR4: [u8; 4] = [10, 96, 0, 40];
/// Node address: the masqueraded NodePort 30080.
pub(crate) const NODE4: [u8; 4] = [10, 0, 0, 100];
/// LoadBalancer IP of the IPIP DSR service (TCP 80) and of the source-range service (443).
pub(crate) const LB4: [u8; 4] = [192, 0, 2, 10];
/// SNAT address.
pub(crate) const SNAT4: [u8; 4] = [10, 0, 0, 254];
/// DNAT service backends (TCP 8080 on both, UDP 53 on the first, SCTP 3868 on the second).
pub(crate) const NAT_BACKENDS4: [[u8; 4]; 2] = [[10, 1, 0, 11], [10, 1, 0, 12]];
/// The SNAT (NodePort) service's backend; it is on another subnet, reached through a route.
pub(crate) const SNAT_BACKEND4: [u8; 4] = [10, 2, 0, 13];

/// IPv6 client.
pub(crate) const CLIENT6: [u8; 16] = ip6(0xfd00, 1);
/// IPv6 router on the client side.
pub(crate) const ROUTER6: [u8; 16] = ip6(0xfd00, 0x200);
/// IPv6 ClusterIP (TCP 80, UDP 53).
pub(crate) const VIP6: [u8; 16] = ip6(0xfd96, 0x10);
/// IPv6 LoadBalancer IP of the IP6IP6 DSR service (TCP 80).
pub(crate) const LB6: [u8; 16] = ip6(0x2001, 0xdb8);
/// IPv6 masqueraded NodePort address (TCP 30080).
pub(crate) const NODE6: [u8; 16] = ip6(0xfd00, 0x100);
/// IPv6 SNAT address.
pub(crate) const SNAT6: [u8; 16] = ip6(0xfd00, 0xfe);

/// Client port of the primed flows.
pub(crate) const CPORT: u16 = 40_000;
/// IPv4 identification of the primed first fragment.
pub(crate) const FRAG_ID: u16 = 0x4242;

const fn ip6(prefix: u16, host: u16) -> [u8; 16] {
    let p = prefix.to_be_bytes();
    let h = host.to_be_bytes();
    [p[0], p[1], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, h[0], h[1]]
}

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

fn v6(a: [u8; 16]) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(a))
}

fn service(name: &str, frontends: Vec<Frontend>, backends: Vec<BackendSpec>, mode: ForwardingMode) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        frontends,
        scheduler: Scheduler::Maglev { port: true },
        affinity_timeout_s: None,
        mode,
        when_empty: EmptyAction::Reject,
        backends,
    }
}

/// The fixed table set (see the module docs).
pub(crate) fn spec() -> TablesSpec {
    use FrontendKind::{ClusterIp, LoadBalancer, NodePort};
    use L4Proto::{Sctp, Tcp, Udp};
    let [b0, b1] = NAT_BACKENDS4.map(v4);
    let mut services = vec![
        service(
            "fuzz/nat:tcp",
            vec![Frontend::new(v4(VIP4), Tcp, 80, ClusterIp, false)],
            vec![BackendSpec::ready(b0, 8080), BackendSpec::ready(b1, 8080)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/nat:udp",
            vec![Frontend::new(v4(VIP4), Udp, 53, ClusterIp, false)],
            vec![BackendSpec::ready(b0, 53)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/nat:sctp",
            vec![Frontend::new(v4(VIP4), Sctp, 3868, ClusterIp, false)],
            vec![BackendSpec::ready(b1, 3868)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/snat",
            vec![Frontend::new(v4(NODE4), Tcp, 30080, NodePort, true)],
            vec![BackendSpec::ready(v4(SNAT_BACKEND4), 8080)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/dsr",
            vec![Frontend::new(v4(LB4), Tcp, 80, LoadBalancer, false)],
            vec![BackendSpec::ready(v4([10, 1, 0, 21]), 80), BackendSpec::ready(v4([10, 1, 0, 22]), 80)],
            ForwardingMode::DsrIpip,
        ),
        service(
            "fuzz/affinity",
            vec![Frontend::new(v4(AFFINITY4), Tcp, 443, ClusterIp, false)],
            vec![BackendSpec::ready(v4([10, 1, 0, 31]), 8443), BackendSpec::ready(v4([10, 1, 0, 32]), 8443)],
            ForwardingMode::Nat,
        ),
        service("fuzz/empty", vec![Frontend::new(v4(EMPTY4), Tcp, 80, ClusterIp, false)], vec![], ForwardingMode::Nat),
        service(
            "fuzz/l2dsr",
            vec![Frontend::new(v4(L2DSR4), Udp, 514, ClusterIp, false)],
            vec![BackendSpec::ready(v4([10, 1, 0, 41]), 514)],
            ForwardingMode::DsrL2,
        ),
        service(
            "fuzz/ranges",
            vec![Frontend {
                source_ranges: vec![Cidr { addr: v4([10, 0, 0, 0]), len: 24 }],
                ..Frontend::new(v4(LB4), Tcp, 443, LoadBalancer, false)
            }],
            vec![BackendSpec::ready(v4([10, 1, 0, 51]), 8443)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/nat6:tcp",
            vec![Frontend::new(v6(VIP6), Tcp, 80, ClusterIp, false)],
            vec![BackendSpec::ready(v6(ip6(0xfd01, 0x11)), 8080), BackendSpec::ready(v6(ip6(0xfd01, 0x12)), 8080)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/nat6:udp",
            vec![Frontend::new(v6(VIP6), Udp, 53, ClusterIp, false)],
            vec![BackendSpec::ready(v6(ip6(0xfd01, 0x11)), 53)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/snat6",
            vec![Frontend::new(v6(NODE6), Tcp, 30080, NodePort, true)],
            vec![BackendSpec::ready(v6(ip6(0xfd01, 0x13)), 8080)],
            ForwardingMode::Nat,
        ),
        service(
            "fuzz/dsr6",
            vec![Frontend::new(v6(LB6), Tcp, 80, LoadBalancer, false)],
            vec![BackendSpec::ready(v6(ip6(0xfd01, 0x21)), 80)],
            ForwardingMode::DsrIpip,
        ),
    ];
    if let Some(s) = services.iter_mut().find(|s| s.name == "fuzz/affinity") {
        s.affinity_timeout_s = Some(10_800);
        s.scheduler = Scheduler::WeightedLeastConnection;
    }
    if let Some(s) = services.iter_mut().find(|s| s.name == "fuzz/dsr") {
        s.scheduler = Scheduler::Random;
    }
    let mut neighbours: Vec<NeighbourSpec> = services
        .iter()
        .flat_map(|s| s.backends.iter())
        .filter(|b| b.addr != v4(SNAT_BACKEND4))
        .enumerate()
        .map(|(i, b)| NeighbourSpec { addr: b.addr, mac: [2, 0, 0, 0, 1, u8::try_from(i).unwrap_or(0)], port: 1 })
        .collect();
    neighbours.sort_by_key(|n| n.addr);
    neighbours.dedup_by_key(|n| n.addr);
    neighbours.push(NeighbourSpec { addr: v4([10, 1, 0, 1]), mac: [2, 0, 0, 0, 1, 0xfe], port: 1 });
    neighbours.push(NeighbourSpec { addr: v4(ROUTER4), mac: [2, 0, 0, 0, 0, 0xc8], port: 0 });
    TablesSpec {
        services: services.into_iter().map(std::sync::Arc::new).collect(),
        ports: vec![
            PortSpec { name: "client".into(), mac: build::LB_MAC, mtu: 1500 },
            PortSpec { name: "backends".into(), mac: [2, 0, 0, 0, 1, 0xfd], mtu: 1500 },
        ],
        neighbours,
        routes: vec![RouteSpec { dst: Cidr { addr: v4([10, 2, 0, 0]), len: 16 }, via: v4([10, 1, 0, 1]) }],
        kernel_routes: vec![],
        multipath_l4: false,
        snat_v4: Some(v4(SNAT4)),
        snat_v6: Some(v6(SNAT6)),
        dsr_source_v4: Some(Cidr { addr: v4([172, 16, 0, 0]), len: 16 }),
        dsr_source_v6: Some(Cidr { addr: v6(ip6(0xfd16, 0)), len: 112 }),
        maglev_max_size: 0,
        maglev_min_size: 0,
        cluster_cidrs: vec![],
    }
}

/// The tables of [`spec`], built once per process.
///
/// # Panics
/// If the spec does not build (a bug in this file).
pub(crate) fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| TableBuilder::new().build(&spec()).unwrap_or_else(|e| panic!("fuzz spec: {e}")))
}

/// A small worker: one worker, small tables (cheap to make per input). The harness never has
/// more than 9 flows per family (8 primed IPv4 flows, 4 IPv6, and at most one from the input),
/// so 64 flows (26 conntrack buckets) keeps every table far from full;
/// a larger table only costs time: the fuzzer makes two workers per input.
pub(crate) fn config() -> PipelineConfig {
    PipelineConfig {
        conntrack_capacity: 64,
        frag_capacity: 64,
        affinity_capacity: 64,
        snat_ports: (20_000, 20_099),
        max_services: 16,
        max_backends: 32,
        ..PipelineConfig::default()
    }
}

fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: u8) -> Frame {
    let ack = if flags & tcp_flags::ACK != 0 { 7000 } else { 0 };
    Frame::ip(src, dst, proto::TCP, &tcp_segment(sport, dport, flags, 1000, ack, &[]), &IpOpts::default())
}

fn udp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, payload: &[u8]) -> Frame {
    Frame::ip(src, dst, proto::UDP, &udp_datagram(sport, dport, payload), &IpOpts::default())
}

/// A first IPv4 fragment (MF set, offset 0) of a UDP datagram longer than what it carries.
fn udp_first_fragment_v4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Frame {
    let mut seg = udp_datagram(sport, dport, &[0x5a; 32]);
    seg[4..6].copy_from_slice(&100u16.to_be_bytes()); // the whole datagram is longer
    let o = IpOpts { ident: FRAG_ID, dont_frag: false, ..IpOpts::default() };
    let mut f = Frame::ip(v4(src), v4(dst), proto::UDP, &seg, &o);
    f.bytes[20] |= 0x20; // MF
    refresh_v4_header(&mut f.bytes);
    f
}

/// A later IPv4 fragment (offset 40 bytes) with identification `id`.
fn later_fragment_v4(src: [u8; 4], dst: [u8; 4], id: u16) -> Frame {
    let o = IpOpts { ident: id, dont_frag: false, ..IpOpts::default() };
    let mut f = Frame::ip(v4(src), v4(dst), proto::UDP, &[0x5a; 60], &o);
    f.bytes[20] = 0; // MF clear: the last fragment
    f.bytes[21] = 5; // offset 5 × 8 = 40 bytes
    refresh_v4_header(&mut f.bytes);
    f
}

/// Recomputes the IPv4 header checksum of an untagged frame.
fn refresh_v4_header(b: &mut [u8]) {
    let hl = usize::from(b[14] & 0x0f) * 4;
    b[24..26].fill(0);
    let c = dataplane::csum::checksum(&b[14..14 + hl]);
    b[24..26].copy_from_slice(&c.to_be_bytes());
}

/// The frames every worker sees before the input: flows of every kind, so that the input can
/// be a reply, an ICMP error quoting a flow, or a later fragment of a tracked series.
pub(crate) fn priming_frames() -> Vec<Frame> {
    let c = v4(CLIENT4);
    let c6 = v6(CLIENT6);
    vec![
        tcp(c, CPORT, v4(VIP4), 80, tcp_flags::SYN),
        udp(c, CPORT, v4(VIP4), 53, b"query"),
        Frame::ip(c, v4(VIP4), proto::SCTP, &sctp_packet(CPORT, 3868, 0, &[1, 0, 0, 4]), &IpOpts::default()),
        tcp(c, CPORT, v4(NODE4), 30080, tcp_flags::SYN),
        tcp(c, CPORT, v4(LB4), 80, tcp_flags::SYN),
        tcp(c, CPORT, v4(AFFINITY4), 443, tcp_flags::SYN),
        udp(c, CPORT, v4(L2DSR4), 514, b"syslog"),
        udp_first_fragment_v4(CLIENT4, CPORT + 1, VIP4, 53),
        tcp(c6, CPORT, v6(VIP6), 80, tcp_flags::SYN),
        udp(c6, CPORT, v6(VIP6), 53, b"query"),
        tcp(c6, CPORT, v6(NODE6), 30080, tcp_flags::SYN),
        tcp(c6, CPORT, v6(LB6), 80, tcp_flags::SYN),
    ]
}

/// A packet buffer holding `frame` at `headroom`, with [`TAILROOM`] after it.
fn buffer(frame: &[u8], headroom: usize) -> Vec<u8> {
    let mut buf = vec![0u8; headroom + frame.len() + TAILROOM];
    buf[headroom..headroom + frame.len()].copy_from_slice(frame);
    buf
}

/// Checks the invariants of the module docs for one packet that left the pipeline with verdict
/// `v` as `out` (from input `frame`), and the worker's counters.
///
/// # Panics
/// If an invariant does not hold.
fn check(p: &Pipeline, t: &Tables, frame: &[u8], v: Verdict, out: &[u8]) {
    let input_ok = build::verify(frame).is_ok();
    match v {
        Verdict::Tx { port } => {
            assert!(usize::from(port) < t.ports.len(), "Tx on port {port}, which does not exist");
            if input_ok && let Err(e) = build::verify(out) {
                panic!("valid input, transmitted with a bad checksum: {e}\n in: {frame:02x?}\nout: {out:02x?}");
            }
        }
        Verdict::Pass => assert_eq!(out, frame, "Pass must leave the frame unchanged"),
        Verdict::Drop(_) => {}
        Verdict::Handoff { worker } => panic!("Handoff to worker {worker} with a single worker"),
    }
    check_counters(p);
}

/// Checks `rx == tx + pass + sum(drops)` on the worker's counters.
///
/// # Panics
/// If they do not add up.
fn check_counters(p: &Pipeline) {
    let k = p.counters();
    let drops: u64 = k.drops.iter().map(|c| c.get()).sum();
    let (rx, tx, pass) = (k.rx.get(), k.tx.get(), k.pass.get());
    assert_eq!(rx, tx + pass + drops, "counters: rx {rx} != tx {tx} + pass {pass} + drops {drops}");
}

/// Processes one frame on port 0 (at [`HEADROOM`]) and checks the invariants of the module
/// docs; returns the verdict and the frame as it left the pipeline.
///
/// # Panics
/// If an invariant does not hold.
pub(crate) fn process_checked(p: &mut Pipeline, t: &Tables, frame: &[u8]) -> (Verdict, Vec<u8>) {
    let mut buf = buffer(frame, HEADROOM);
    let buf_len = buf.len();
    let mut pkt = Packet::new(&mut buf, HEADROOM, frame.len());
    let v = p.process(t, &mut pkt, 0);
    assert!(pkt.head + pkt.len <= buf_len, "frame outside its buffer: head {} len {}", pkt.head, pkt.len);
    let out = pkt.frame().to_vec();
    check(p, t, frame, v, &out);
    (v, out)
}

/// Processes `frames` on port 0 as one batch at headroom 0 (where encapsulation moves the
/// packet into the tailroom; [`process_checked`] runs with [`HEADROOM`] bytes in front, as the
/// AF_XDP workers leave 256) and checks the invariants for each.
///
/// # Panics
/// If an invariant does not hold.
pub(crate) fn process_batch_checked(p: &mut Pipeline, t: &Tables, frames: &[&[u8]]) -> Vec<(Verdict, Vec<u8>)> {
    let mut bufs: Vec<Vec<u8>> = frames.iter().map(|f| buffer(f, 0)).collect();
    let lens: Vec<usize> = bufs.iter().map(Vec::len).collect();
    let mut pkts: Vec<Packet<'_>> = bufs.iter_mut().zip(frames).map(|(b, f)| Packet::new(b, 0, f.len())).collect();
    let mut verdicts = vec![Verdict::Pass; pkts.len()];
    p.process_batch(t, &mut pkts, 0, &mut verdicts);
    let mut out = Vec::new();
    for ((pkt, v), (f, len)) in pkts.iter().zip(verdicts).zip(frames.iter().zip(lens)) {
        assert!(pkt.head + pkt.len <= len, "frame outside its buffer: head {} len {}", pkt.head, pkt.len);
        let o = pkt.frame().to_vec();
        check(p, t, f, v, &o);
        out.push((v, o));
    }
    out
}

/// (frame, verdict, frame as sent) of each priming frame, from a checked priming run.
type Reference = Vec<(Vec<u8>, Verdict, Vec<u8>)>;

/// A fresh worker that has processed [`priming_frames`] at [`NOW_MS`].
///
/// Every priming frame is checked like an input ([`process_checked`]) on the first worker a
/// process primes with [`tables`]; the verdicts and frames of that run are kept, and later
/// workers must reproduce them byte for byte (plus the buffer and counter checks), which is
/// the same check for a fraction of the cost (the fuzzer primes two workers per input).
///
/// # Panics
/// If a priming frame is not forwarded (the table set or the pipeline changed meaning), fails
/// a check, or leaves a worker differently from the checked run.
pub(crate) fn primed(t: &Tables) -> Pipeline {
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    if !std::ptr::eq(t, tables()) {
        return primed_checked(t).0;
    }
    let reference = REFERENCE.get_or_init(|| primed_checked(t).1);
    let mut p = Pipeline::new(config(), SEED);
    p.begin_batch(t, NOW_MS);
    let mut buf = Vec::new();
    for (i, (frame, verdict, sent)) in reference.iter().enumerate() {
        buf.clear();
        buf.resize(HEADROOM + frame.len() + TAILROOM, 0);
        buf[HEADROOM..HEADROOM + frame.len()].copy_from_slice(frame);
        let buf_len = buf.len();
        let mut pkt = Packet::new(&mut buf, HEADROOM, frame.len());
        let v = p.process(t, &mut pkt, 0);
        assert!(pkt.head + pkt.len <= buf_len, "frame outside its buffer: head {} len {}", pkt.head, pkt.len);
        assert_eq!(v, *verdict, "priming frame {i}: verdict differs from the checked priming run");
        assert_eq!(pkt.frame(), &sent[..], "priming frame {i}: output differs from the checked priming run");
        check_counters(&p);
    }
    p
}

/// A fresh worker primed with every check of [`process_checked`], and what it made of each
/// priming frame.
///
/// # Panics
/// If a priming frame is not forwarded or fails a check.
fn primed_checked(t: &Tables) -> (Pipeline, Reference) {
    let mut p = Pipeline::new(config(), SEED);
    p.begin_batch(t, NOW_MS);
    let mut reference = Vec::new();
    for (i, f) in priming_frames().into_iter().enumerate() {
        let (v, sent) = process_checked(&mut p, t, &f.bytes);
        assert!(matches!(v, Verdict::Tx { .. }), "priming frame {i} not forwarded: {v:?}");
        reference.push((f.bytes, v, sent));
    }
    (p, reference)
}

/// The fuzz entry point: `data` (cut to [`MAX_FRAME`] bytes) is one Ethernet frame, processed
/// twice by a [`primed`] worker. Returns both verdicts.
///
/// # Panics
/// If an invariant of the module docs does not hold (that is the finding).
pub(crate) fn run(t: &Tables, data: &[u8]) -> [Verdict; 2] {
    let frame = data.get(..MAX_FRAME).unwrap_or(data);
    let mut p = primed(t);
    let first = process_checked(&mut p, t, frame);
    let second = process_checked(&mut p, t, frame);
    // The same two packets at headroom 0, in one batch, through a worker in the same state: the
    // batch pipeline gives the same verdicts and the same bytes as one packet at a time.
    let mut q = primed(t);
    let batch = process_batch_checked(&mut q, t, &[frame, frame]);
    assert_eq!(batch, [first.clone(), second.clone()], "batch at headroom 0 differs from one at a time");
    [first.0, second.0]
}

/// What the primed worker sent for priming frame `i` (to derive replies and ICMP errors).
fn primed_output(t: &Tables, i: usize) -> Vec<u8> {
    let mut p = Pipeline::new(config(), SEED);
    p.begin_batch(t, NOW_MS);
    let frames = priming_frames();
    let mut out = Vec::new();
    for f in frames.iter().take(i + 1) {
        out = process_checked(&mut p, t, &f.bytes).1;
    }
    out
}

/// (src, sport, dst, dport) of an untagged TCP/UDP frame's IP and L4 headers.
fn tuple(f: &[u8], v6: bool) -> (IpAddr, u16, IpAddr, u16) {
    let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    if v6 {
        let a = |at: usize| v6_at(f, at);
        (a(22), port(54), a(38), port(56))
    } else {
        let hl = usize::from(f[14] & 0x0f) * 4;
        let a = |at: usize| v4(<[u8; 4]>::try_from(&f[at..at + 4]).unwrap_or_default());
        (a(26), port(14 + hl), a(30), port(16 + hl))
    }
}

fn v6_at(f: &[u8], at: usize) -> IpAddr {
    v6(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap_or_default())
}

/// The first `IP header + 8` bytes of an untagged frame's IP packet (what routers quote).
fn quote(f: &[u8]) -> Vec<u8> {
    let hl = if f[12..14] == [0x86, 0xdd] { 40 } else { usize::from(f[14] & 0x0f) * 4 };
    f[14..(14 + hl + 8).min(f.len())].to_vec()
}

/// An ICMP / ICMPv6 error from `from` to `to` quoting `quoted`: destination unreachable
/// (port / fragmentation needed) or time exceeded for IPv4, packet too big or destination
/// unreachable for IPv6.
fn icmp_error(from: IpAddr, to: IpAddr, ty: u8, code: u8, rest: [u8; 4], quoted: &[u8]) -> Frame {
    let pr = if from.is_ipv6() { proto::ICMPV6 } else { proto::ICMP };
    Frame::ip(from, to, pr, &icmp_message(ty, code, rest, quoted), &IpOpts::default())
}

/// The seed corpus: `(file name without .bin, frame)`. Covers TCP SYN/ACK/FIN/RST v4 and v6,
/// UDP (with and without checksum), SCTP, replies of DNAT and SNAT flows, ICMP errors
/// quoting tracked flows in both directions, fragments, VLAN tags, IPv4 options, IPv6
/// extension headers, DSR paths, rejects, TTL expiry, oversize frames, non-IP and
/// truncated frames.
pub(crate) fn seeds() -> Vec<(String, Vec<u8>)> {
    use tcp_flags::{ACK, FIN, PSH, RST, SYN};
    let t = tables();
    let c = v4(CLIENT4);
    let c6 = v6(CLIENT6);
    let fixed: Vec<(&str, Frame)> = vec![
        ("tcp_syn_v4_new", tcp(c, CPORT + 10, v4(VIP4), 80, SYN)),
        ("tcp_ack_v4_established", tcp(c, CPORT, v4(VIP4), 80, ACK)),
        ("tcp_psh_ack_v4_payload", {
            let seg = tcp_segment(CPORT, 80, PSH | ACK, 1001, 7000, b"GET / HTTP/1.1\r\n\r\n");
            Frame::ip(c, v4(VIP4), proto::TCP, &seg, &IpOpts::default())
        }),
        ("tcp_fin_v4", tcp(c, CPORT, v4(VIP4), 80, FIN | ACK)),
        ("tcp_rst_v4", tcp(c, CPORT, v4(VIP4), 80, RST)),
        ("tcp_syn_v4_other_port_rejected", tcp(c, CPORT, v4(VIP4), 81, SYN)),
        ("tcp_syn_v4_no_endpoints_rejected", tcp(c, CPORT, v4(EMPTY4), 80, SYN)),
        ("tcp_syn_v4_snat_nodeport", tcp(c, CPORT + 10, v4(NODE4), 30080, SYN)),
        ("tcp_syn_v4_dsr_ipip", tcp(c, CPORT + 10, v4(LB4), 80, SYN)),
        ("tcp_ack_v4_dsr_ipip_too_big", {
            let seg = tcp_segment(CPORT + 11, 80, ACK, 1, 1, &[0x61; 1400]);
            Frame::ip(c, v4(LB4), proto::TCP, &seg, &IpOpts::default())
        }),
        ("tcp_syn_v4_affinity", tcp(c, CPORT + 10, v4(AFFINITY4), 443, SYN)),
        ("tcp_syn_v4_source_range_allowed", tcp(c, CPORT, v4(LB4), 443, SYN)),
        ("tcp_syn_v4_source_range_denied", tcp(v4([198, 51, 100, 7]), CPORT, v4(LB4), 443, SYN)),
        ("tcp_syn_v4_ttl1", {
            let o = IpOpts { ttl: 1, ..IpOpts::default() };
            Frame::ip(c, v4(VIP4), proto::TCP, &tcp_segment(CPORT + 12, 80, SYN, 1, 0, &[]), &o)
        }),
        ("tcp_syn_v4_not_ours", tcp(c, CPORT, v4([8, 8, 8, 8]), 80, SYN)),
        ("udp_v4_established", udp(c, CPORT, v4(VIP4), 53, b"query")),
        ("udp_v4_new", udp(c, CPORT + 10, v4(VIP4), 53, b"query")),
        ("udp_v4_zero_checksum", {
            let mut f = udp(c, CPORT + 13, v4(VIP4), 53, b"query");
            f.bytes[40..42].fill(0);
            f
        }),
        ("udp_v4_ip_options", Frame::udp_v4_opts(CLIENT4, CPORT + 14, VIP4, 53, 8)),
        ("udp_v4_l2_dsr", udp(c, CPORT + 10, v4(L2DSR4), 514, b"syslog")),
        ("sctp_v4_init", {
            let chunk = [1, 0, 0, 20, 0, 0, 0, 1, 0, 0, 0x10, 0, 0, 1, 0, 1, 0, 0, 0, 1];
            Frame::ip(c, v4(VIP4), proto::SCTP, &sctp_packet(CPORT + 10, 3868, 0, &chunk), &IpOpts::default())
        }),
        ("icmp_echo_to_vip_v4", icmp_error(c, v4(VIP4), 8, 0, [0, 1, 0, 1], b"ping")),
        ("udp_first_fragment_v4", udp_first_fragment_v4(CLIENT4, CPORT + 20, VIP4, 53)),
        ("udp_later_fragment_v4_tracked", later_fragment_v4(CLIENT4, VIP4, FRAG_ID)),
        ("udp_later_fragment_v4_untracked", later_fragment_v4(CLIENT4, VIP4, 0x0bad)),
        ("tcp_syn_v4_vlan", {
            let mut f = tcp(c, CPORT + 15, v4(VIP4), 80, SYN);
            f.vlan(100);
            f
        }),
        ("udp_v4_vlan", {
            let mut f = udp(c, CPORT, v4(VIP4), 53, b"query");
            f.vlan(4094);
            f
        }),
        ("tcp_syn_v6_new", tcp(c6, CPORT + 10, v6(VIP6), 80, SYN)),
        ("tcp_ack_v6_established", tcp(c6, CPORT, v6(VIP6), 80, ACK)),
        ("tcp_syn_v6_snat_nodeport", tcp(c6, CPORT + 10, v6(NODE6), 30080, SYN)),
        ("tcp_syn_v6_dsr_ip6ip6", tcp(c6, CPORT + 10, v6(LB6), 80, SYN)),
        ("tcp_syn_v6_other_port_rejected", tcp(c6, CPORT, v6(VIP6), 81, SYN)),
        ("udp_v6_established", udp(c6, CPORT, v6(VIP6), 53, b"query")),
        ("udp_v6_ext_headers", Frame::udp_v6_with_ext(CLIENT6, CPORT + 16, VIP6, 53, false)),
        ("udp_v6_first_fragment", Frame::udp_v6_with_ext(CLIENT6, CPORT + 17, VIP6, 53, true)),
        ("tcp_syn_v6_vlan", {
            let mut f = tcp(c6, CPORT + 18, v6(VIP6), 80, SYN);
            f.vlan(7);
            f
        }),
    ];

    // Replies and ICMP errors of the primed flows (priming frame indices: 0 TCP DNAT, 3 TCP
    // SNAT, 8 TCP DNAT v6, 10 TCP SNAT v6).
    let mut s: Vec<(String, Frame)> = fixed.into_iter().map(|(n, f)| (n.to_owned(), f)).collect();
    for (name, i, is_v6) in [("v4", 0, false), ("v4_snat", 3, false), ("v6", 8, true), ("v6_snat", 10, true)] {
        let out = primed_output(t, i);
        // out: client-or-SNAT → backend. The backend's reply goes the other way.
        let (src, sport, backend, bport) = tuple(&out, is_v6);
        let reply = tcp(backend, bport, src, sport, SYN | ACK);
        let q = quote(&out);
        let (ty, code, rest) = if is_v6 { (1, 4, [0; 4]) } else { (3, 3, [0; 4]) };
        // The backend reports its port unreachable about the packet xlb sent it.
        let unreach = icmp_error(backend, src, ty, code, rest, &q);
        s.push((format!("tcp_synack_reply_{name}"), reply));
        s.push((format!("icmp_port_unreachable_from_backend_{name}"), unreach));
    }
    // A client-side router reports on a reply xlb sent to the client (source VIP): PMTU.
    let frag_needed = |q: &Frame| icmp_error(v4(ROUTER4), v4(VIP4), 3, 4, [0, 0, 5, 0xdc], &quote(&q.bytes));
    let reply_v4 = tcp(v4(VIP4), 80, c, CPORT, SYN | ACK);
    s.push(("icmp_frag_needed_quoting_reply_v4".into(), frag_needed(&reply_v4)));
    let time_exceeded = icmp_error(v4(ROUTER4), v4(VIP4), 11, 0, [0; 4], &quote(&reply_v4.bytes));
    s.push(("icmp_time_exceeded_quoting_reply_v4".into(), time_exceeded));
    let reply_v6 = tcp(v6(VIP6), 80, c6, CPORT, SYN | ACK);
    let too_big = icmp_error(v6(ROUTER6), v6(VIP6), 2, 0, 1280u32.to_be_bytes(), &quote(&reply_v6.bytes));
    s.push(("icmp6_packet_too_big_quoting_reply_v6".into(), too_big));
    s.push(("icmp_frag_needed_untracked_v4".into(), frag_needed(&tcp(v4(VIP4), 80, c, CPORT + 99, ACK))));
    s.push(("tcp_to_snat_address_untracked".into(), tcp(v4([10, 9, 9, 9]), 8080, v4(SNAT4), 20_050, ACK)));

    let mut out: Vec<(String, Vec<u8>)> = s.into_iter().map(|(n, f)| (n, f.bytes)).collect();
    // Non-IP and truncated frames.
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&build::CLIENT_MAC);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[0; 20]);
    out.push(("arp_request".into(), arp));
    let syn = tcp(c, CPORT + 30, v4(VIP4), 80, SYN).bytes;
    for cut in [0, 6, 13, 14, 20, 33, 34, 40, 53] {
        out.push((format!("truncated_tcp_v4_{cut}"), syn[..cut].to_vec()));
    }
    let syn6 = tcp(c6, CPORT + 30, v6(VIP6), 80, SYN).bytes;
    for cut in [30, 53, 60] {
        out.push((format!("truncated_tcp_v6_{cut}"), syn6[..cut].to_vec()));
    }
    let mut vlan_only = syn.clone();
    vlan_only.splice(12..12, [0x81, 0x00, 0, 5]);
    vlan_only.truncate(16);
    out.push(("truncated_vlan_tag".into(), vlan_only));
    out
}
