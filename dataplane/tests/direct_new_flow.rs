//! The slow path's direct route for new flows of the most common kind
//! (`Pipeline::set_direct_new_flows`) against the general route, on the fuzz harness's tables
//! (every forwarding mode), a variant with cluster CIDRs and a backend without a next hop, and
//! that variant with its Maglev services on the random scheduler (whose draw the direct route
//! makes in stage 5): streams of new flows of every kind — direct ones, hairpins, masqueraded
//! NodePorts, source ranges, DSR, affinity, IPv6, tagged frames, mid-stream pickups, a TTL that
//! expires, a service without endpoints, martian sources, duplicates in one batch, SYNs to a second VIP from the
//! client port of a picked-up flow with the same backends (one reply tuple) — through a small
//! flow table that fills and evicts, and under a new-flow rate limit. Both routes must give the same
//! verdicts and bytes, the same flows and the same counters; the direct route must have been
//! taken. Also: new flows of one batch to frontends that share an address reach their own
//! frontend (stage 4 reuses the previous new flow's frontend lookup only for the same address,
//! protocol and port); and known flows' next packets take the fast stage on every path.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane::addr::Cidr;
use dataplane::build::{Frame, IpOpts, tcp_segment, udp_datagram};
use dataplane::counters::DropReason;
use dataplane::nat::Packet;
use dataplane::process::{Pipeline, PipelineConfig, Verdict};
use dataplane::tables::{
    BackendSpec, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, Scheduler, ServiceSpec, TableBuilder,
    Tables,
};
use dataplane::wire::{proto, tcp_flags};

#[path = "../fuzz/harness.rs"]
#[allow(dead_code, reason = "shared with the fuzz target; this test uses part of it")]
mod harness;

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

/// A VIP of the variant tables whose one backend has no neighbour entry and no route.
const NO_HOP_VIP4: [u8; 4] = [10, 96, 0, 50];
/// A VIP of the variant tables with the same backends as the harness's DNAT service on
/// `harness::VIP4`:80 (Maglev), so that one client port to both can meet one reply tuple.
const SECOND_VIP4: [u8; 4] = [10, 96, 0, 51];

/// The harness's tables with cluster CIDRs (10.0.0.0/24: the harness's client is inside, the
/// 192.168.1.0/24 clients are not, so their ClusterIP flows are masqueraded) and a service
/// whose backend has no next hop.
fn variant_tables() -> Tables {
    TableBuilder::new().build(&variant_spec()).unwrap_or_else(|e| panic!("variant spec: {e}"))
}

/// The variant's spec.
fn variant_spec() -> dataplane::tables::TablesSpec {
    let mut spec = harness::spec();
    spec.cluster_cidrs = vec![Cidr { addr: v4([10, 0, 0, 0]), len: 24 }];
    // A ClusterIP :80/TCP service with Maglev in NAT mode.
    let clusterip = |name: &str, vip: [u8; 4], backends: Vec<BackendSpec>| {
        std::sync::Arc::new(ServiceSpec {
            name: name.into(),
            frontends: vec![Frontend::new(v4(vip), L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
            scheduler: Scheduler::Maglev { port: true },
            affinity_timeout_s: None,
            mode: ForwardingMode::Nat,
            when_empty: EmptyAction::Reject,
            backends,
        })
    };
    spec.services.push(clusterip("direct/no-hop", NO_HOP_VIP4, vec![BackendSpec::ready(v4([10, 3, 0, 9]), 8080)]));
    let [b0, b1] = harness::NAT_BACKENDS4.map(v4);
    spec.services.push(clusterip(
        "direct/second",
        SECOND_VIP4,
        vec![BackendSpec::ready(b0, 8080), BackendSpec::ready(b1, 8080)],
    ));
    spec
}

/// The variant with every Maglev service (the DNAT ones, the no-hop one, the empty one, the
/// masqueraded NodePorts) on the random scheduler, which `make bench`'s configuration uses
/// (kube-proxy's iptables and nftables behaviour), and the DNAT backends' subnet
/// (10.1.0.0/24) in the cluster CIDRs too, so that a backend's flow to its own service is a
/// hairpin of the direct kind until the draw picks that backend.
fn random_tables() -> Tables {
    let mut spec = variant_spec();
    spec.cluster_cidrs.push(Cidr { addr: v4([10, 1, 0, 0]), len: 24 });
    // The stream's martian sources (224.0.0.0/24) inside the cluster CIDRs too, so that only
    // their source keeps them off the direct route.
    spec.cluster_cidrs.push(Cidr { addr: v4([224, 0, 0, 0]), len: 24 });
    for s in &mut spec.services {
        if matches!(s.scheduler, Scheduler::Maglev { .. }) {
            std::sync::Arc::make_mut(s).scheduler = Scheduler::Random;
        }
    }
    TableBuilder::new().build(&spec).unwrap_or_else(|e| panic!("random spec: {e}"))
}

/// A small deterministic generator (the stream must be the same for both routes).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }
}

fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: u8, ttl: u8) -> Vec<u8> {
    let ack = if flags & tcp_flags::ACK != 0 { 7000 } else { 0 };
    let o = IpOpts { ttl, ..IpOpts::default() };
    Frame::ip(src, dst, proto::TCP, &tcp_segment(sport, dport, flags, 1000, ack, &[]), &o).bytes
}

fn udp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    Frame::ip(src, dst, proto::UDP, &udp_datagram(sport, dport, b"q"), &IpOpts::default()).bytes
}

/// `n` frames of new flows of every kind (see the module docs), in a mixed order.
fn stream(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut g = Lcg(seed);
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(n);
    while out.len() < n {
        let r = g.next();
        let sport = 1024 + (g.next() % 60_000) as u16;
        let host = (g.next() % 200) as u8 + 2;
        // Inside the variant's cluster CIDR, or outside it.
        let client = if r & 1 == 0 { v4([10, 0, 0, host]) } else { v4([192, 168, 1, host]) };
        // Now and then a martian source (multicast), which neither route may make a flow of.
        let client = if (r >> 20).is_multiple_of(32) { v4([224, 0, 0, host]) } else { client };
        let vip = v4(harness::VIP4);
        let f = match (r >> 1) % 16 {
            0..=5 => tcp(client, sport, vip, 80, tcp_flags::SYN, 64),
            6 => udp(client, sport, vip, 53),
            7 => tcp(client, sport, vip, 80, tcp_flags::ACK, 64),
            8 => tcp(client, sport, vip, 80, tcp_flags::SYN, 1),
            // Hairpin: a backend to its own service (masqueraded when Maglev picks it).
            9 => tcp(v4(harness::NAT_BACKENDS4[(r >> 8) as usize % 2]), sport, vip, 80, tcp_flags::SYN, 64),
            10 => tcp(client, sport, v4(harness::NODE4), 30080, tcp_flags::SYN, 64),
            11 => tcp(client, sport, v4(harness::LB4), if r & 0x100 == 0 { 443 } else { 80 }, tcp_flags::SYN, 64),
            12 => tcp(client, sport, v4(harness::AFFINITY4), 443, tcp_flags::SYN, 64),
            13 => {
                let c6 = IpAddr::V6(Ipv6Addr::from(harness::CLIENT6));
                tcp(c6, sport, IpAddr::V6(Ipv6Addr::from(harness::VIP6)), 80, tcp_flags::SYN, 64)
            }
            14 => {
                let mut f = Frame { bytes: tcp(client, sport, vip, 80, tcp_flags::SYN, 64) };
                f.vlan(7);
                f.bytes
            }
            // A service without endpoints (rejected), or one whose backend has no next hop.
            _ if r & 0x400 != 0 => tcp(client, sport, v4(harness::EMPTY4), 80, tcp_flags::SYN, 64),
            _ => tcp(client, sport, v4(NO_HOP_VIP4), 80, tcp_flags::SYN, 64),
        };
        // Now and then the same packet twice in a row (a retransmitted SYN in the same batch).
        if r & 0x3000 == 0 {
            out.push(f.clone());
        }
        out.push(f);
        // Now and then a picked-up flow to VIP4:80 (established) and a SYN from the same
        // client port to the second VIP: on the variant tables, when both reach one backend
        // (DNAT, from inside the cluster CIDR), one reply tuple, and the SYN is dropped.
        if r & 0x7_0000 == 0x1_0000 {
            let sport = 1024 + (g.next() % 60_000) as u16;
            out.push(tcp(client, sport, vip, 80, tcp_flags::ACK, 64));
            out.push(tcp(client, sport, v4(SECOND_VIP4), 80, tcp_flags::SYN, 64));
        }
    }
    out.truncate(n);
    out
}

/// Everything a worker shows of what it did, for comparison.
#[derive(Debug, PartialEq, Eq)]
struct State {
    flows: Vec<String>,
    rx: u64,
    tx: u64,
    pass: u64,
    drops: Vec<u64>,
    events: Vec<u64>,
    objects: [Vec<u64>; 4],
    connections: Vec<(u32, u32)>,
}

fn state(p: &Pipeline) -> State {
    let mut flows: Vec<String> = p.dump_flows().iter().map(|f| format!("{f:?}")).collect();
    flows.sort();
    let k = p.counters();
    let vals = |c: &[dataplane::counters::Counter]| c.iter().map(|x| x.get()).collect::<Vec<_>>();
    let o = &k.objects;
    State {
        flows,
        rx: k.rx.get(),
        tx: k.tx.get(),
        pass: k.pass.get(),
        drops: vals(&k.drops),
        events: vals(&k.events),
        objects: [vals(&o.service_packets), vals(&o.service_flows), vals(&o.backend_packets), vals(&o.backend_flows)],
        connections: (0..32).map(|i| p.connections(dataplane::tables::BackendRef(i))).collect(),
    }
}

/// Runs `frames` through a fresh worker in batches of `size` at headroom 0, the clock
/// moving 100 ms per batch and the batches arriving on ports 0 and 1 in turn, then the
/// backends' replies to every IPv4 frame it sent; returns each frame's verdict and bytes
/// (the stream's, then the replies'), and the worker.
fn run(
    t: &Tables,
    cfg: &PipelineConfig,
    direct: bool,
    frames: &[Vec<u8>],
    size: usize,
) -> (Vec<(Verdict, Vec<u8>)>, Pipeline) {
    let mut p = Pipeline::new(cfg.clone(), harness::SEED);
    // The same flow table layout in both workers (a full table evicts by layout).
    p.set_flow_table_seeds([0x5eed, 1, 2, 3, 4]);
    p.set_direct_new_flows(direct);
    let mut out = Vec::with_capacity(frames.len());
    let mut batch = 0;
    for chunk in frames.chunks(size) {
        out.extend(process(&mut p, t, chunk, batch));
        batch += 1;
    }
    let replies: Vec<Vec<u8>> = out.iter().filter_map(|(v, f)| reply_to(*v, f)).collect();
    for chunk in replies.chunks(size) {
        out.extend(process(&mut p, t, chunk, batch));
        batch += 1;
    }
    (out, p)
}

/// Batch number `batch` (clock `NOW_MS + 100 * batch`, port `batch % 2`).
fn process(p: &mut Pipeline, t: &Tables, chunk: &[Vec<u8>], batch: u64) -> Vec<(Verdict, Vec<u8>)> {
    process_in(p, t, chunk, batch, 0, harness::TAILROOM)
}

/// [`process`] with the frames at `headroom` in buffers with `tailroom` bytes after them.
fn process_in(
    p: &mut Pipeline,
    t: &Tables,
    chunk: &[Vec<u8>],
    batch: u64,
    headroom: usize,
    tailroom: usize,
) -> Vec<(Verdict, Vec<u8>)> {
    p.begin_batch(t, harness::NOW_MS + 100 * batch);
    let mut bufs: Vec<Vec<u8>> = chunk
        .iter()
        .map(|f| {
            let mut v = vec![0xa5; headroom];
            v.extend_from_slice(f);
            v.resize(headroom + f.len() + tailroom, 0);
            v
        })
        .collect();
    let mut pkts: Vec<Packet<'_>> =
        bufs.iter_mut().zip(chunk).map(|(b, f)| Packet::new(b, headroom, f.len())).collect();
    let mut verdicts = vec![Verdict::Pass; pkts.len()];
    p.process_batch(t, &mut pkts, (batch % 2) as u8, &mut verdicts);
    pkts.iter().zip(verdicts).map(|(pkt, v)| (v, pkt.frame().to_vec())).collect()
}

/// The backend's answer (an ACK, or a UDP datagram) to an untagged IPv4 TCP or UDP frame
/// that was transmitted.
fn reply_to(v: Verdict, f: &[u8]) -> Option<Vec<u8>> {
    if !matches!(v, Verdict::Tx { .. }) || f.get(12..14) != Some(&[8, 0]) || f.len() < 38 {
        return None;
    }
    let ip = |at: usize| v4([f[at], f[at + 1], f[at + 2], f[at + 3]]);
    let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    let (src, dst, sport, dport) = (ip(26), ip(30), port(34), port(36));
    match f[23] {
        proto::TCP => Some(tcp(dst, dport, src, sport, tcp_flags::SYN | tcp_flags::ACK, 64)),
        proto::UDP => Some(udp(dst, dport, src, sport)),
        _ => None,
    }
}

/// Runs `frames` through both routes in batches of 64, 16, 5 and 1 and compares them; returns
/// the direct route's new flows and its `reply_tuple_in_use` drops, over the four runs.
fn compare(t: &Tables, cfg: &PipelineConfig, frames: &[Vec<u8>], what: &str) -> (u64, u64) {
    let (mut direct_flows, mut clashes) = (0, 0);
    for size in [64, 16, 5, 1] {
        let (got, d) = run(t, cfg, true, frames, size);
        let (want, g) = run(t, cfg, false, frames, size);
        assert_eq!(g.direct_new_flows(), 0, "{what}: the general route took the direct one");
        // Replies check what the record keeps for them (port, MAC, reverse deltas); a full
        // table has evicted most flows by the time they come (58 of 600 sent there, seed 1), a rate limit most new flows (15).
        let replies_sent = got.iter().skip(frames.len()).filter(|(v, _)| matches!(v, Verdict::Tx { .. })).count();
        assert!(replies_sent >= 10, "{what}, batches of {size}: only {replies_sent} replies forwarded");
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            assert_eq!(x, y, "{what}, batches of {size}: frame {i} differs (direct, then general)");
        }
        assert_eq!(state(&d), state(&g), "{what}, batches of {size}: the workers differ (direct, then general)");
        direct_flows += d.direct_new_flows();
        clashes += d.counters().drops_of(DropReason::ReplyTupleInUse);
    }
    (direct_flows, clashes)
}

#[test]
fn direct_new_flows_give_what_the_general_route_gives() {
    let (variant, random) = (variant_tables(), random_tables());
    // 48 flows per family: the 600 frames fill the table many times over, so new flows evict.
    let small = PipelineConfig { conntrack_capacity: 48, ..harness::config() };
    let roomy = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
    let limited = PipelineConfig { new_flows_per_s: 20, ..roomy.clone() };
    // Fewest direct new flows per run with room: about 10 in 16 frames go to the DNAT service
    // on VIP4 (SYNs, UDP, pickups, TTL 1, tagged), so about 370 of 600 qualify (344 to 351 per
    // run at `ea48055`); the variant's cluster CIDRs send the half from outside them to SNAT
    // (140 to 150).
    // On the random tables, the variant's share, less the hairpins and no-hop draws, which
    // go on in the general route.
    let tables = [
        (harness::tables(), "harness tables", 250),
        (&variant, "variant tables", 100),
        (&random, "random tables", 100),
    ];
    for (t, name, least) in tables {
        for (cfg, cname) in [(&roomy, "room"), (&small, "full table"), (&limited, "rate limit")] {
            for seed in [1, 2, 3] {
                let frames = stream(600, seed);
                let what = format!("{name}, {cname}, seed {seed}");
                let (direct, clashes) = compare(t, cfg, &frames, &what);
                if cname == "room" {
                    assert!(direct >= 4 * least, "{what}: only {direct} direct new flows over four runs");
                    if name != "harness tables" {
                        assert!(clashes > 0, "{what}: no new flow met a live flow's reply tuple");
                    }
                } else {
                    assert!(direct > 0, "{what}: no direct new flow");
                }
            }
        }
    }
}

/// Tables in which one address carries three frontends, TCP 53, UDP 53 and TCP 80, and a
/// second address TCP 53, each the only frontend of its service with one backend of its own
/// (10.5.0.1 to 10.5.0.4), the first two services with Maglev, the others with the random
/// scheduler.
fn shared_address_tables() -> Tables {
    use dataplane::tables::{NeighbourSpec, PortSpec, TablesSpec};
    let (a, b) = (v4([10, 96, 7, 1]), v4([10, 96, 7, 2]));
    let fes = [(a, L4Proto::Tcp, 53), (a, L4Proto::Udp, 53), (a, L4Proto::Tcp, 80), (b, L4Proto::Tcp, 53)];
    let services = fes
        .iter()
        .enumerate()
        .map(|(i, &(addr, proto, port))| {
            std::sync::Arc::new(ServiceSpec {
                name: format!("shared/svc-{i}:p"),
                frontends: vec![Frontend::new(addr, proto, port, FrontendKind::ClusterIp, false)],
                scheduler: if i < 2 { Scheduler::Maglev { port: true } } else { Scheduler::Random },
                affinity_timeout_s: None,
                mode: ForwardingMode::Nat,
                when_empty: EmptyAction::Reject,
                backends: vec![BackendSpec::ready(v4([10, 5, 0, 1 + i as u8]), 8000)],
            })
        })
        .collect();
    let neighbours =
        (1..=4u8).map(|i| NeighbourSpec { addr: v4([10, 5, 0, i]), mac: [2, 0, 0, 0, 5, i], port: 1 }).collect();
    let spec = TablesSpec {
        services,
        ports: vec![
            PortSpec { name: "client".into(), mac: [2, 0, 0, 0, 0, 0xfe], mtu: 1500 },
            PortSpec { name: "backends".into(), mac: [2, 0, 0, 0, 1, 0xfe], mtu: 1500 },
        ],
        neighbours,
        routes: vec![],
        kernel_routes: vec![],
        multipath_l4: false,
        snat_v4: None,
        snat_v6: None,
        dsr_source_v4: None,
        dsr_source_v6: None,
        maglev_max_size: 0,
        maglev_min_size: 0,
        cluster_cidrs: vec![],
    };
    TableBuilder::new().build(&spec).unwrap_or_else(|e| panic!("shared-address spec: {e}"))
}

/// Stage 4 reuses the frontend of the previous new flow of a batch when the address,
/// protocol and port are the same; new flows that differ from the one before in only the
/// protocol, only the port or only the address must each reach their own frontend's backend,
/// and a port without a frontend none, whichever route (direct or general) and batch size.
#[test]
fn new_flows_in_one_batch_reach_the_frontend_of_their_own_protocol_port_and_address() {
    let t = shared_address_tables();
    let (a, b, client) = (v4([10, 96, 7, 1]), v4([10, 96, 7, 2]), v4([192, 168, 9, 9]));
    // (frame, the backend it must reach: the last octet of 10.5.0.x, 0 for none)
    let mut cases: Vec<(Vec<u8>, u8)> = Vec::new();
    for (k, sport) in (2000u16..2048).enumerate() {
        // Each frame differs from the one before in one of address, protocol and port, or in
        // nothing (the two UDP ones).
        let (frame, want) = match k % 8 {
            0 | 2 | 5 => (tcp(client, sport, a, 53, tcp_flags::SYN, 64), 1),
            1 => (tcp(client, sport, b, 53, tcp_flags::SYN, 64), 4),
            3 | 4 => (udp(client, sport, a, 53), 2),
            6 => (tcp(client, sport, a, 80, tcp_flags::SYN, 64), 3),
            _ => (tcp(client, sport, a, 54, tcp_flags::SYN, 64), 0),
        };
        cases.push((frame, want));
    }
    let frames: Vec<Vec<u8>> = cases.iter().map(|(f, _)| f.clone()).collect();
    for direct in [true, false] {
        for size in [64, 7, 1] {
            let cfg = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
            let (out, p) = run(&t, &cfg, direct, &frames, size);
            for (i, ((v, f), (_, want))) in out.iter().zip(&cases).enumerate() {
                let what = format!("direct {direct}, batches of {size}, frame {i}");
                if *want == 0 {
                    // Rejected (an ICMP error back where the frame came from), not forwarded.
                    assert_ne!(f.get(30..33), Some(&[10, 5, 0][..]), "{what}: sent to a backend: {v:?}");
                    continue;
                }
                assert_eq!(*v, Verdict::Tx { port: 1 }, "{what}");
                assert_eq!(f.get(30..34), Some(&[10, 5, 0, *want][..]), "{what}: wrong backend");
            }
            if direct {
                assert!(p.direct_new_flows() > 0, "batches of {size}: no direct new flow");
            }
        }
    }
}

/// Frames whose buffer ends where the frame ends (no tailroom), at headroom 0 and 256, are
/// forwarded as frames with room after them are, byte for byte: new flows (SYNs) and their next
/// packets (ACKs, rewritten in stage 3 from the record, in a range of the buffer that must
/// end inside the frame), over IPv4 and IPv6.
#[test]
fn frames_that_end_their_buffer_are_rewritten_as_frames_with_tailroom() {
    let t = harness::tables();
    let cfg = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
    let pairs = [
        (v4(harness::CLIENT4), v4(harness::VIP4)),
        (IpAddr::V6(Ipv6Addr::from(harness::CLIENT6)), IpAddr::V6(Ipv6Addr::from(harness::VIP6))),
    ];
    for (client, vip) in pairs {
        let syns: Vec<Vec<u8>> = (0..64u16).map(|i| tcp(client, 30_000 + i, vip, 80, tcp_flags::SYN, 64)).collect();
        let acks: Vec<Vec<u8>> = (0..64u16).map(|i| tcp(client, 30_000 + i, vip, 80, tcp_flags::ACK, 64)).collect();
        let mut outs = Vec::new();
        for (headroom, tailroom) in [(0, harness::TAILROOM), (0, 0), (256, 0)] {
            let mut p = Pipeline::new(cfg.clone(), harness::SEED);
            p.set_flow_table_seeds([0x5eed, 1, 2, 3, 4]);
            let mut out = process_in(&mut p, t, &syns, 0, headroom, tailroom);
            out.extend(process_in(&mut p, t, &acks, 1, headroom, tailroom));
            assert!(out.iter().all(|(v, _)| matches!(v, Verdict::Tx { .. })), "{vip} {headroom}/{tailroom}: {out:?}");
            assert_eq!(p.shaped_batches().iter().sum::<u64>(), 2, "{vip} {headroom}/{tailroom}: the shaped stages");
            outs.push(out);
        }
        assert_eq!(outs[0], outs[1], "{vip}: no tailroom, headroom 0");
        assert_eq!(outs[0], outs[2], "{vip}: no tailroom, headroom 256");
    }
}

/// A batch of IPv6 TCP frames behind an untagged Ethernet header (the IPv6 common shape) runs
/// the shaped stages (`Pipeline::batch_shaped` for IPv6) and its new flows the direct route,
/// as IPv4 ones do; both routes give the same frames and flows, and so do the flows' next
/// packets (ACKs, through the shaped stage 3).
#[test]
fn ipv6_tcp_batches_take_the_shaped_stages_and_the_direct_route() {
    let t = harness::tables();
    let (client, vip) = (IpAddr::V6(Ipv6Addr::from(harness::CLIENT6)), IpAddr::V6(Ipv6Addr::from(harness::VIP6)));
    let syns: Vec<Vec<u8>> = (0..64u16).map(|i| tcp(client, 30_000 + i, vip, 80, tcp_flags::SYN, 64)).collect();
    let acks: Vec<Vec<u8>> = (0..64u16).map(|i| tcp(client, 30_000 + i, vip, 80, tcp_flags::ACK, 64)).collect();
    let cfg = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
    let mut outs = Vec::new();
    for direct in [true, false] {
        let mut p = Pipeline::new(cfg.clone(), harness::SEED);
        p.set_flow_table_seeds([0x5eed, 1, 2, 3, 4]);
        p.set_direct_new_flows(direct);
        let mut out = process(&mut p, t, &syns, 0);
        out.extend(process(&mut p, t, &acks, 1));
        assert!(out.iter().all(|(v, _)| matches!(v, Verdict::Tx { .. })), "direct {direct}: {out:?}");
        assert_eq!(p.shaped_batches(), [0, 2], "direct {direct}: both batches through the IPv6 shaped stages");
        assert_eq!(p.direct_new_flows(), if direct { 64 } else { 0 }, "direct {direct}");
        outs.push((out, state(&p)));
    }
    assert_eq!(outs[0], outs[1], "the direct route gives what the general route gives");
}

/// The next packets of known flows (ACKs after the SYNs) are rewritten by the fast stage
/// (stage 3) from their records, none by the slow path, which would give the same frames: on
/// the common shapes' stages (a batch of IPv4 or IPv6 TCP alone) and on the general ones (a
/// batch mixing both families, and one of 802.1Q-tagged frames), and the backends' replies
/// too. Stage 2 finds a flow's entry in the home bucket stage 1 computed for its prefetch;
/// with that bucket wrong, every one of these packets would go to the slow path.
#[test]
fn known_flows_next_packets_take_the_fast_stage_on_every_path() {
    type MakeFrame<'a> = Box<dyn Fn(u16, u8) -> Vec<u8> + 'a>;
    let t = harness::tables();
    let (c4, vip4) = (v4([10, 0, 0, 7]), v4(harness::VIP4));
    let (c6, vip6) = (IpAddr::V6(Ipv6Addr::from(harness::CLIENT6)), IpAddr::V6(Ipv6Addr::from(harness::VIP6)));
    let tagged = |f: Vec<u8>| {
        let mut f = Frame { bytes: f };
        f.vlan(7);
        f.bytes
    };
    let cfg = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
    let mut p = Pipeline::new(cfg, harness::SEED);
    let mut batch = 0;
    // A batch's packets that went to the slow path, and its frames (all transmitted).
    let mut step = |p: &mut Pipeline, frames: &[Vec<u8>], what: &str| {
        let before = p.slow_packets();
        let out = process(p, t, frames, batch);
        batch += 1;
        assert!(out.iter().all(|(v, _)| matches!(v, Verdict::Tx { .. })), "{what}: {out:?}");
        (p.slow_packets() - before, out)
    };
    // IPv4 and IPv6 alone (the shaped stages), mixed (the general stages), tagged (general).
    let shapes: [(&str, MakeFrame<'_>); 4] = [
        ("IPv4", Box::new(|i, fl| tcp(c4, 20_000 + i, vip4, 80, fl, 64))),
        ("IPv6", Box::new(|i, fl| tcp(c6, 20_000 + i, vip6, 80, fl, 64))),
        (
            "mixed",
            Box::new(|i, fl| {
                if i % 2 == 0 { tcp(c4, 21_000 + i, vip4, 80, fl, 64) } else { tcp(c6, 21_000 + i, vip6, 80, fl, 64) }
            }),
        ),
        ("tagged", Box::new(|i, fl| tagged(tcp(c4, 22_000 + i, vip4, 80, fl, 64)))),
    ];
    for (what, frame) in &shapes {
        let syns: Vec<Vec<u8>> = (0..64).map(|i| frame(i, tcp_flags::SYN)).collect();
        let acks: Vec<Vec<u8>> = (0..64).map(|i| frame(i, tcp_flags::ACK)).collect();
        let (slow, _) = step(&mut p, &syns, what);
        assert_eq!(slow, 64, "{what}: the SYNs are new flows");
        let (slow, out) = step(&mut p, &acks, what);
        assert_eq!(slow, 0, "{what}: every ACK through stage 3");
        // The backends' answers to the untagged IPv4 ones: reply entries found in stage 3 too.
        let replies: Vec<Vec<u8>> = out.iter().filter_map(|(v, f)| reply_to(*v, f)).collect();
        assert_eq!(
            replies.len(),
            if matches!(*what, "IPv4") {
                64
            } else if *what == "mixed" {
                32
            } else {
                0
            }
        );
        if !replies.is_empty() {
            let (slow, _) = step(&mut p, &replies, what);
            assert_eq!(slow, 0, "{what}: every reply through stage 3");
        }
    }
    // The shaped stages ran IPv4's SYNs, ACKs and replies and IPv6's SYNs and ACKs; the rest
    // ran on the general ones (after the mixed batch, the next 16 batches go there at once).
    assert_eq!(p.shaped_batches(), [3, 2]);
}

/// A node whose two ports differ in MTU (jumbo frames on one side, 1,500 bytes on the other,
/// either way round): the packets of its flows that fit the port they leave on are rewritten
/// by the fast stage (each flow has `flow_flags::MTU_CHECK`, which the stage checks), exactly
/// at the smaller MTU too, on the common shapes' stages (IPv4, IPv6) and the general ones
/// (802.1Q-tagged); one byte more, forward or reply, and every one goes to the slow path (which
/// answers it with "fragmentation needed" / "packet too big"), none leaving oversized; after
/// that the flows' packets that fit take the fast stage again.
#[test]
fn flows_between_ports_of_different_mtus_take_the_fast_stage_with_every_packet_that_fits() {
    let (c4, vip4) = (v4([10, 0, 0, 7]), v4(harness::VIP4));
    let (c6, vip6) = (IpAddr::V6(Ipv6Addr::from(harness::CLIENT6)), IpAddr::V6(Ipv6Addr::from(harness::VIP6)));
    // A TCP segment of `src` → `dst` whose IP packet is `len` bytes (`tagged`: behind 802.1Q).
    let sized = |src: IpAddr, sp: u16, dst: IpAddr, dp: u16, flags: u8, len: usize, tagged: bool| {
        let hl = if src.is_ipv4() { 20 } else { 40 };
        let data = vec![0x61; len.saturating_sub(hl + 20)];
        let mut f = Frame::ip(src, dst, proto::TCP, &tcp_segment(sp, dp, flags, 1000, 7000, &data), &IpOpts::default());
        if tagged {
            f.vlan(7);
        }
        f.bytes
    };
    for (client_mtu, backend_mtu) in [(9000u16, 1500u16), (1500, 9000)] {
        let mut spec = harness::spec();
        spec.ports[0].mtu = client_mtu;
        spec.ports[1].mtu = backend_mtu;
        let t = TableBuilder::new().build(&spec).unwrap_or_else(|e| panic!("spec: {e}"));
        let cfg = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
        let mut p = Pipeline::new(cfg, harness::SEED);
        let small = usize::from(client_mtu.min(backend_mtu));
        // Forward packets grow past the smaller MTU where the backends' port has it, replies
        // where the clients' port has it.
        let (fwd_max, reply_max) = if backend_mtu < client_mtu { (small, 9000) } else { (9000, small) };
        let mut batch = 0u64;
        // Runs `frames` arriving on port `in_port` (`process` takes it from the batch's
        // number); the packets that went to the slow path, and the verdicts and frames.
        let mut run = |p: &mut Pipeline, frames: &[Vec<u8>], in_port: u64| {
            batch += 1 + u64::from(batch % 2 == in_port);
            let before = p.slow_packets();
            let out = process(p, &t, frames, batch);
            (p.slow_packets() - before, out)
        };
        let shapes: [(&str, IpAddr, IpAddr, bool); 3] =
            [("IPv4", c4, vip4, false), ("IPv6", c6, vip6, false), ("tagged", c4, vip4, true)];
        for (k, (what, client, vip, tagged)) in shapes.into_iter().enumerate() {
            let what = format!("{what}, MTUs {client_mtu} / {backend_mtu}");
            let sport = |i: u16| 20_000 + 1000 * u16::try_from(k).unwrap_or(0) + i;
            let fwd = |flags: u8, len: usize| -> Vec<Vec<u8>> {
                (0..64).map(|i| sized(client, sport(i), vip, 80, flags, len, tagged)).collect()
            };
            let (slow, out) = run(&mut p, &fwd(tcp_flags::SYN, 60), 0);
            assert_eq!(slow, 64, "{what}: the SYNs are new flows");
            assert!(out.iter().all(|(v, _)| *v == Verdict::Tx { port: 1 }), "{what}: {out:?}");
            // Each flow's tuple as its SYN left (the source the backend answers: the client, or
            // the SNAT address and port where the flow is masqueraded).
            let left: Vec<[(IpAddr, u16); 2]> = out
                .iter()
                .map(|(_, f)| {
                    let (l3, v6) = (if tagged { 18 } else { 14 }, !tagged && client.is_ipv6());
                    let addr = |at: usize| match v6 {
                        true => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap_or_default())),
                        false => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&f[at..at + 4]).unwrap_or_default())),
                    };
                    let (src, dst, l4) = if v6 { (l3 + 8, l3 + 24, l3 + 40) } else { (l3 + 12, l3 + 16, l3 + 20) };
                    let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
                    [(addr(src), port(l4)), (addr(dst), port(l4 + 2))]
                })
                .collect();
            let replies = |len: usize| -> Vec<Vec<u8>> {
                left.iter().map(|&[(s, sp), (b, bp)]| sized(b, bp, s, sp, tcp_flags::ACK, len, tagged)).collect()
            };
            let (slow, out) = run(&mut p, &fwd(tcp_flags::ACK, fwd_max), 0);
            assert_eq!(slow, 0, "{what}: forward packets of {fwd_max} bytes through stage 3");
            assert!(out.iter().all(|(v, _)| *v == Verdict::Tx { port: 1 }), "{what}");
            let (slow, out) = run(&mut p, &replies(reply_max), 1);
            assert_eq!(slow, 0, "{what}: replies of {reply_max} bytes through stage 3");
            assert!(out.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }), "{what}");
            // One byte over the smaller port's MTU, in the direction that leaves on it.
            let (over, in_port, out_port) = if backend_mtu < client_mtu {
                (fwd(tcp_flags::ACK, small + 1), 0, 1)
            } else {
                (replies(small + 1), 1, 0)
            };
            let (slow, out) = run(&mut p, &over, in_port);
            assert_eq!(slow, 64, "{what}: {} bytes go to the slow path", small + 1);
            assert!(
                out.iter().all(|(v, f)| match v {
                    Verdict::Tx { port } => *port != out_port && f.len() < small,
                    _ => true,
                }),
                "{what}: none leaves oversized"
            );
            let (slow, _) = run(&mut p, &fwd(tcp_flags::ACK, fwd_max), 0);
            assert_eq!(slow, 0, "{what}: forward packets through stage 3 again");
        }
    }
}

/// A node with two ports on the clients' side (0 and 2, MTU 9,000) and the backends behind
/// port 1 (MTU 1,500): an ICMP error answering a packet of a known flow leaves on the port that
/// packet came in on, to the MAC it came from, even when the flow's first packet came in on the
/// other (the record's `in_port`, where replies go): "fragmentation needed" for a packet too
/// big for the backends' port, time exceeded for a TTL that runs out. On the record's port
/// instead, the error would reach no one.
#[test]
fn errors_about_a_known_flows_packet_leave_on_the_port_it_came_in_on() {
    let mut spec = harness::spec();
    spec.ports[0].mtu = 9000;
    spec.ports[1].mtu = 1500;
    spec.ports.push(dataplane::tables::PortSpec { name: "client2".into(), mac: [2, 0, 0, 0, 2, 0xfd], mtu: 9000 });
    let t = TableBuilder::new().build(&spec).unwrap_or_else(|e| panic!("spec: {e}"));
    let cfg = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
    let mut p = Pipeline::new(cfg, harness::SEED);
    let (c4, vip4) = (v4([10, 0, 0, 7]), v4(harness::VIP4));
    // One frame through the pipeline, arrived on `port`: its verdict and bytes.
    let mut one = |frame: Vec<u8>, port: u8, batch: u64| {
        p.begin_batch(&t, harness::NOW_MS + 100 * batch);
        let mut buf = frame.clone();
        buf.resize(frame.len() + harness::TAILROOM, 0);
        let mut pkt = Packet::new(&mut buf, 0, frame.len());
        let v = p.process(&t, &mut pkt, port);
        (v, pkt.frame().to_vec())
    };
    let segment = |flags: u8, ttl: u8, len: usize| {
        let o = IpOpts { ttl, ..IpOpts::default() };
        let data = vec![0x61; len - 40];
        Frame::ip(c4, vip4, proto::TCP, &tcp_segment(30_000, 80, flags, 1000, 7000, &data), &o).bytes
    };
    let (v, _) = one(segment(tcp_flags::SYN, 64, 40), 0, 0);
    assert_eq!(v, Verdict::Tx { port: 1 }, "the flow's SYN, in on port 0");
    for (what, frame) in [("1,600 bytes", segment(tcp_flags::ACK, 64, 1600)), ("TTL 1", segment(tcp_flags::ACK, 1, 40))]
    {
        let src_mac = frame[6..12].to_vec();
        let (v, out) = one(frame, 2, 1);
        assert_eq!(v, Verdict::Tx { port: 2 }, "{what}, in on port 2: the error leaves there");
        assert_eq!(out[0..6], src_mac[..], "{what}: to the MAC it came from");
        assert_eq!(out[23], proto::ICMP, "{what}: an ICMP error");
    }
}

/// The next packets of DSR flows (IPIP, IP6IP6, and L2 DSR over UDP) are rewritten by the fast
/// stage (stage 3, `dsr_at`) into the frames the slow path makes of them (`nat::encap_at`,
/// which the slow path runs when a record is stale: the same tables built again, one
/// generation later): for both families, untagged and 802.1Q-tagged, with TOS / traffic class
/// and DF set and clear, payloads from none to 1,400 bytes (the encapsulated IP6IP6 packet
/// then fills the 1,500-byte MTU), with and without Ethernet padding, and in buffers with
/// headroom for the outer header or only tailroom, or neither (then both give the packet to
/// the slow path, which answers as it does).
#[test]
fn dsr_packets_of_known_flows_are_encapsulated_by_the_fast_stage_as_by_the_slow_path() {
    let spec = harness::spec();
    let mut builder = TableBuilder::new();
    let t1 = builder.build(&spec).unwrap_or_else(|e| panic!("spec: {e}"));
    let t2 = builder.build(&spec).unwrap_or_else(|e| panic!("spec: {e}"));
    assert_ne!(t1.generation, t2.generation);
    let cfg = PipelineConfig { conntrack_capacity: 4096, ..harness::config() };
    let (c4, c6) = (v4([192, 168, 1, 7]), IpAddr::V6(Ipv6Addr::from(harness::CLIENT6)));
    let (lb4, lb6, l2dsr) = (v4(harness::LB4), IpAddr::V6(Ipv6Addr::from(harness::LB6)), v4(harness::L2DSR4));
    // (client, VIP, UDP?): IPIP, IP6IP6, L2 DSR.
    let flows = [(c4, lb4, false), (c6, lb6, false), (c4, l2dsr, true)];
    let mut port = 10_000u16;
    let mut cases = 0;
    for (client, vip, is_udp) in flows {
        for tagged in [false, true] {
            for (tos, df) in [(0u8, true), (0xb8, false)] {
                for payload in [0usize, 1, 100, 1_400] {
                    for pad in [0usize, 6] {
                        for (headroom, tailroom) in [(0, 64), (0, 40), (0, 19), (19, 64), (20, 0), (40, 0), (0, 0)] {
                            port += 1;
                            let frame = |flags: u8, data: &[u8]| {
                                let o = IpOpts { dont_frag: df, ..IpOpts::default() };
                                let l4 = if is_udp {
                                    udp_datagram(port, 514, data)
                                } else {
                                    tcp_segment(port, 80, flags, 1000, 7000, data)
                                };
                                let mut f =
                                    Frame::ip(client, vip, if is_udp { proto::UDP } else { proto::TCP }, &l4, &o);
                                if client.is_ipv4() {
                                    f.bytes[15] = tos;
                                    f.bytes[24..26].fill(0);
                                    let c = dataplane::csum::checksum(&f.bytes[14..34]);
                                    f.bytes[24..26].copy_from_slice(&c.to_be_bytes());
                                } else {
                                    f.bytes[14] = 0x60 | tos >> 4;
                                    f.bytes[15] = tos << 4;
                                }
                                if tagged {
                                    f.vlan(7);
                                }
                                f.bytes.resize(f.bytes.len() + pad, 0);
                                f.bytes
                            };
                            let first = frame(tcp_flags::SYN, &[]);
                            let next = frame(tcp_flags::ACK, &vec![0x61; payload]);
                            // Room for the outer header: in front of the frame, or behind its IP
                            // packet (the padding and the tailroom).
                            let add = if client.is_ipv4() { 20 } else { 40 };
                            let room = is_udp || headroom >= add || pad + tailroom >= add;
                            let what = format!(
                                "{vip} tagged {tagged} tos {tos:#x} df {df} payload {payload} pad {pad} room {headroom}/{tailroom}"
                            );
                            let mut outs = Vec::new();
                            for stale in [false, true] {
                                let mut p = Pipeline::new(cfg.clone(), harness::SEED);
                                let out = process_in(&mut p, &t1, std::slice::from_ref(&first), 0, 256, 256);
                                assert!(matches!(out[0].0, Verdict::Tx { .. }), "{what}, first: {out:?}");
                                let before = p.slow_packets();
                                let t = if stale { &t2 } else { &t1 };
                                let out = process_in(&mut p, t, std::slice::from_ref(&next), 1, headroom, tailroom);
                                let slow = p.slow_packets() - before;
                                let want = u64::from(stale || !room);
                                assert_eq!(slow, want, "{what}, stale {stale}: packets to the slow path");
                                if room {
                                    assert!(matches!(out[0].0, Verdict::Tx { .. }), "{what}, stale {stale}: {out:?}");
                                }
                                outs.push(out);
                            }
                            assert_eq!(outs[0], outs[1], "{what}");
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 3 * 2 * 2 * 4 * 2 * 7);
}
