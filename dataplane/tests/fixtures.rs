//! Packet fixtures in the style of Katran's tester: each row is a description, a setup
//! (tables, earlier packets, a table change), an input frame, the expected verdict and the
//! expected output frame. Expected frames are built from scratch by `dataplane::build`, so a
//! byte-equal match also proves every incrementally updated checksum.
//!
//! The same rows are kept as pcap files (`tests/fixtures/inputs.pcap`, `expected.pcap`, and
//! `index.tsv` naming each record, with its step's clock step and table change) so the corpus can be replayed through a live AF_XDP
//! socket. `XLB_BLESS=1 cargo test -p dataplane --test fixtures` rewrites them; otherwise
//! the test fails if they differ from the rows.

use std::net::IpAddr;
use std::sync::Arc;

use dataplane::addr::Cidr;
use dataplane::build::{self, CLIENT_MAC, Frame, IpOpts, LB_MAC, icmp_message, sctp_packet, tcp_segment, udp_datagram};
use dataplane::counters::{DropReason, Event};
use dataplane::nat::Packet;
use dataplane::process::{Pipeline, PipelineConfig, SWEEP_BUDGET, Verdict};
use dataplane::tables::*;
use dataplane::wire::{proto, tcp_flags::*};

const HEADROOM: usize = 256;
const BUF: usize = 2048;

const C4: [u8; 4] = [10, 0, 0, 1];
const C4B: [u8; 4] = [10, 0, 0, 2];
const VIP4: [u8; 4] = [10, 96, 0, 10];
const NODE4: [u8; 4] = [10, 0, 0, 100];
const LBIP4: [u8; 4] = [192, 0, 2, 10];
const B4: [[u8; 4]; 3] = [[10, 1, 0, 11], [10, 1, 0, 12], [10, 1, 0, 13]];
const SNAT4: [u8; 4] = [10, 0, 0, 254];
const DSR4: [u8; 4] = [172, 16, 0, 1];
const ROUTER4: [u8; 4] = [10, 0, 0, 200];

const C6: [u8; 16] = ip6(0xfd00, 1);
const VIP6: [u8; 16] = ip6(0xfd96, 0x10);
const NODE6: [u8; 16] = ip6(0xfd00, 0x100);
const B6: [[u8; 16]; 3] = [ip6(0xfd01, 0x11), ip6(0xfd01, 0x12), ip6(0xfd01, 0x13)];
const SNAT6: [u8; 16] = ip6(0xfd00, 0xfe);
const DSR6: [u8; 16] = ip6(0xfd16, 1);
const ROUTER6: [u8; 16] = ip6(0xfd00, 0x200);

const BMAC: [[u8; 6]; 3] = [[2, 0, 0, 0, 1, 0x11], [2, 0, 0, 0, 1, 0x12], [2, 0, 0, 0, 1, 0x13]];

const fn ip6(prefix: u16, host: u16) -> [u8; 16] {
    let p = prefix.to_be_bytes();
    let h = host.to_be_bytes();
    [p[0], p[1], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, h[0], h[1]]
}

/// An address pair of one family, so each scenario is written once for IPv4 and IPv6.
#[derive(Clone, Copy)]
struct Fam {
    v6: bool,
    client: IpAddr,
    client2: IpAddr,
    vip: IpAddr,
    node: IpAddr,
    lbip: IpAddr,
    backends: [IpAddr; 3],
    snat: IpAddr,
    dsr: IpAddr,
    router: IpAddr,
}

fn v4() -> Fam {
    Fam {
        v6: false,
        client: C4.into(),
        client2: C4B.into(),
        vip: VIP4.into(),
        node: NODE4.into(),
        lbip: LBIP4.into(),
        backends: [B4[0].into(), B4[1].into(), B4[2].into()],
        snat: SNAT4.into(),
        dsr: DSR4.into(),
        router: ROUTER4.into(),
    }
}

fn v6() -> Fam {
    Fam {
        v6: true,
        client: C6.into(),
        client2: ip6(0xfd00, 2).into(),
        vip: VIP6.into(),
        node: NODE6.into(),
        lbip: ip6(0x2001, 0xdb8).into(),
        backends: [B6[0].into(), B6[1].into(), B6[2].into()],
        snat: SNAT6.into(),
        dsr: DSR6.into(),
        router: ROUTER6.into(),
    }
}

/// A ready backend on this node (`node_local` is for display; forwarding does not read it).
fn local_backend(addr: IpAddr, port: u16) -> BackendSpec {
    BackendSpec { node_local: true, ..BackendSpec::ready(addr, port) }
}

fn service(name: &str, frontends: Vec<Frontend>, backends: Vec<BackendSpec>, mode: ForwardingMode) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        frontends,
        scheduler: Scheduler::RoundRobin,
        affinity_timeout_s: None,
        mode,
        when_empty: EmptyAction::Reject,
        backends,
    }
}

/// The standard setup's web service (see [`spec`]): ClusterIP :80/TCP and :53/UDP and NodePort
/// :30080 (masqueraded) to backend 0's 8080, round robin.
fn standard_web(f: Fam) -> ServiceSpec {
    service(
        "default/web:http",
        vec![
            Frontend::new(f.vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false),
            Frontend::new(f.vip, L4Proto::Udp, 53, FrontendKind::ClusterIp, false),
            Frontend::new(f.node, L4Proto::Tcp, 30080, FrontendKind::NodePort, true),
        ],
        vec![local_backend(f.backends[0], 8080)],
        ForwardingMode::Nat,
    )
}

/// The standard setup for a family: one web service (ClusterIP :80 → :8080, NodePort
/// :30080 masqueraded, LB IP :80 with source ranges), one backend unless told otherwise.
fn spec(f: Fam, mut services: Vec<ServiceSpec>) -> TablesSpec {
    if services.is_empty() {
        services.push(standard_web(f));
    }
    let (dsr4, dsr6) =
        if f.v6 { (None, Some(Cidr { addr: f.dsr, len: 128 })) } else { (Some(Cidr { addr: f.dsr, len: 32 }), None) };
    TablesSpec {
        services: services.into_iter().map(Arc::new).collect(),
        ports: vec![PortSpec { name: "eth0".into(), mac: LB_MAC, mtu: 1500 }],
        neighbours: f.backends.iter().zip(BMAC).map(|(a, mac)| NeighbourSpec { addr: *a, mac, port: 0 }).collect(),
        routes: vec![],
        kernel_routes: vec![],
        multipath_l4: false,
        snat_v4: (!f.v6).then_some(f.snat),
        snat_v6: f.v6.then_some(f.snat),
        dsr_source_v4: dsr4,
        dsr_source_v6: dsr6,
        maglev_max_size: 0,
        maglev_min_size: 0,
        cluster_cidrs: vec![],
    }
}

/// Two Services, one backend: the ClusterIP `vip`:80 and the LoadBalancer `lbip`:80, both to
/// backend 0's port 8080 (one client port to both meets one reply tuple at the backend).
fn two_frontends_one_backend(f: Fam) -> TablesSpec {
    spec(
        f,
        vec![
            service(
                "default/web:http",
                vec![Frontend::new(f.vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
                vec![local_backend(f.backends[0], 8080)],
                ForwardingMode::Nat,
            ),
            service(
                "default/web-lb:http",
                vec![Frontend::new(f.lbip, L4Proto::Tcp, 80, FrontendKind::LoadBalancer, false)],
                vec![local_backend(f.backends[0], 8080)],
                ForwardingMode::Nat,
            ),
        ],
    )
}

fn opts(ttl: u8) -> IpOpts {
    IpOpts { ttl, ..IpOpts::default() }
}

fn tcp(src: IpAddr, sp: u16, dst: IpAddr, dp: u16, flags: u8, ttl: u8, macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let seg = tcp_segment(sp, dp, flags, 1000, if flags & ACK != 0 { 7000 } else { 0 }, &[]);
    let mut fr = Frame::ip(src, dst, proto::TCP, &seg, &opts(ttl));
    fr.macs(macs.0, macs.1);
    fr.bytes
}

fn udp(src: IpAddr, sp: u16, dst: IpAddr, dp: u16, ttl: u8, macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let mut fr = Frame::ip(src, dst, proto::UDP, &udp_datagram(sp, dp, b"xlb?"), &opts(ttl));
    fr.macs(macs.0, macs.1);
    fr.bytes
}

const IN: ([u8; 6], [u8; 6]) = (CLIENT_MAC, LB_MAC);
const fn to_b(i: usize) -> ([u8; 6], [u8; 6]) {
    (LB_MAC, BMAC[i])
}
const fn from_b(i: usize) -> ([u8; 6], [u8; 6]) {
    (BMAC[i], LB_MAC)
}
const OUT: ([u8; 6], [u8; 6]) = (LB_MAC, CLIENT_MAC);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Expect {
    /// Transmitted on port 0 as exactly this frame.
    Tx(Vec<u8>),
    /// Transmitted on this port (not 0) as exactly this frame.
    TxOn(u8, Vec<u8>),
    /// Handed to the kernel ([`KERNEL_PORT`]: the worker writes its IP packet into the punt
    /// device) as exactly this frame.
    ToKernel(Vec<u8>),
    /// Passed to the kernel unchanged.
    Pass,
    /// Dropped with this reason.
    Drop(DropReason),
    /// Handed, unchanged, to this worker (`Verdict::Handoff`).
    Handoff(u16),
}

struct Step {
    what: &'static str,
    /// Replace the tables before this step.
    retable: Option<TablesSpec>,
    /// Seconds to advance the clock before this step.
    advance_s: u64,
    input: Vec<u8>,
    expect: Expect,
}

struct Row {
    name: String,
    setup: TablesSpec,
    config: PipelineConfig,
    steps: Vec<Step>,
}

fn step(what: &'static str, input: Vec<u8>, expect: Expect) -> Step {
    Step { what, retable: None, advance_s: 0, input, expect }
}

fn row(name: &str, f: Fam, setup: TablesSpec, steps: Vec<Step>) -> Row {
    Row {
        name: format!("{}/{}", if f.v6 { "v6" } else { "v4" }, name),
        setup,
        config: PipelineConfig { conntrack_capacity: 1024, snat_ports: (1024, 2047), ..PipelineConfig::default() },
        steps,
    }
}

fn icmp_error(
    f: Fam,
    from: IpAddr,
    to: IpAddr,
    quote: &[u8],
    too_big: bool,
    ttl: u8,
    macs: ([u8; 6], [u8; 6]),
) -> Vec<u8> {
    let (ty, code, rest, pr) = match (f.v6, too_big) {
        (false, true) => (3, 4, [0, 0, 0x05, 0xdc], proto::ICMP),
        (false, false) => (3, 3, [0; 4], proto::ICMP),
        (true, true) => (2, 0, 1500u32.to_be_bytes(), proto::ICMPV6),
        (true, false) => (1, 4, [0; 4], proto::ICMPV6),
    };
    let mut fr = Frame::ip(from, to, pr, &icmp_message(ty, code, rest, quote), &opts(ttl));
    fr.macs(macs.0, macs.1);
    fr.bytes
}

/// Writes the IPv4 header checksum (RFC 791) of the `hl`-byte header at 14 of frame `fr`,
/// after a test changed its fields.
fn ipv4_header_checksum(fr: &mut [u8], hl: usize) {
    fr[24..26].fill(0);
    let cs = dataplane::csum::checksum(&fr[14..14 + hl]);
    fr[24..26].copy_from_slice(&cs.to_be_bytes());
}

/// The first `ip header + 8` bytes of a frame's IP packet (what routers quote).
fn quote(frame: &[u8], v6: bool) -> Vec<u8> {
    let hl = if v6 { 40 } else { 20 };
    frame[14..14 + hl + 8].to_vec()
}

fn ipip(f: Fam, inner: &[u8], backend: IpAddr, mac: [u8; 6], sport: u16) -> Vec<u8> {
    // The inner IP packet (TTL already decremented), encapsulated (RFC 2003 / RFC 2473).
    let ip = &inner[14..];
    let mut o = Frame::ip(f.dsr, backend, if f.v6 { proto::IPV6 } else { proto::IPIP }, ip, &opts(64));
    if f.v6 {
        // Flow label: the low 20 bits of the documented flow hash (RFC 6438).
        let src = match f.client {
            IpAddr::V6(a) => a.octets(),
            IpAddr::V4(_) => unreachable!(),
        };
        let h = (dataplane::maglev::source_hash(&src, Some(sport)) & 0xf_ffff) as u32;
        let w = (6u32 << 28) | h;
        o.bytes[14..18].copy_from_slice(&w.to_be_bytes());
    } else {
        // Identification 0; DF copied from the inner header (set by the builder).
        o.bytes[18..20].fill(0);
        ipv4_header_checksum(&mut o.bytes, 20);
    }
    o.macs(LB_MAC, mac);
    o.bytes
}

fn rows_for(f: Fam) -> Vec<Row> {
    let c = f.client;
    let vip = f.vip;
    let b0 = f.backends[0];
    // --- DNAT (ClusterIP) and its reply ---
    let mut rows = vec![row(
        "clusterip_dnat_rewrites_destination_and_keeps_client_ip",
        f,
        spec(f, vec![]),
        vec![
            step(
                "SYN to VIP:80",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "SYN-ACK from backend is translated back to the VIP",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, c, 40000, SYN | ACK, 63, OUT)),
            ),
            step(
                "ACK follows the flow",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
        ],
    )];
    // A direct connection from the client to the backend (routed by the kernel, not through a
    // VIP) from the port of the client's closing connection through the VIP: the backend's
    // SYN-ACK matches the closing flow's reply tuple but is not that flow's.
    rows.push(row(
        "a_backends_syn_ack_on_the_reply_tuple_of_a_closing_flow_is_the_kernels_and_the_flow_is_forgotten",
        f,
        spec(f, vec![]),
        vec![
            step(
                "SYN to VIP:80",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "SYN-ACK from the backend",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, c, 40000, SYN | ACK, 63, OUT)),
            ),
            step(
                "ACK: established",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
            step(
                "a SYN-ACK retransmitted to an established flow is still the flow's",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, c, 40000, SYN | ACK, 63, OUT)),
            ),
            step(
                "FIN from the client: closing",
                tcp(c, 40000, vip, 80, FIN | ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, FIN | ACK, 63, to_b(0))),
            ),
            step(
                "a SYN-ACK on the closing flow's reply tuple answers a direct connection: the kernel's",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Pass,
            ),
            step(
                "the direct connection's next packet finds no flow either",
                tcp(b0, 8080, c, 40000, ACK, 64, from_b(0)),
                Expect::Pass,
            ),
            step(
                "a new connection through the VIP from that port is a new flow",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
        ],
    ));
    rows.push(row(
        "udp_dnat_and_reply",
        f,
        spec(f, vec![]),
        vec![
            step("UDP query", udp(c, 5000, vip, 53, 64, IN), Expect::Tx(udp(c, 5000, b0, 8080, 63, to_b(0)))),
            step("UDP answer", udp(b0, 8080, c, 5000, 64, from_b(0)), Expect::Tx(udp(vip, 53, c, 5000, 63, OUT))),
        ],
    ));

    if f.v6 {
        // A datagram whose checksum, rewritten for the backend's address and port, sums to
        // zero: UDP over IPv6 carries that as 0xFFFF (RFC 768), as the builder writes it; 0
        // means no checksum, which IPv6 receivers discard (RFC 8200 §8.1).
        let dgram = |dst: IpAddr, dp: u16, w: u16, ttl: u8, macs: ([u8; 6], [u8; 6])| {
            let mut fr = Frame::ip(c, dst, proto::UDP, &udp_datagram(5000, dp, &w.to_be_bytes()), &opts(ttl));
            fr.macs(macs.0, macs.1);
            fr.bytes
        };
        let w = (0..=u16::MAX)
            .find(|&w| dgram(b0, 8080, w, 63, to_b(0))[60..62] == [0xff, 0xff])
            .expect("a payload whose rewritten checksum sums to zero");
        rows.push(row(
            "udp_v6_dnat_whose_checksum_sums_to_zero_carries_it_as_all_ones",
            f,
            spec(f, vec![]),
            vec![
                step(
                    "the flow's first datagram",
                    dgram(vip, 53, w, 64, IN),
                    Expect::Tx(dgram(b0, 8080, w, 63, to_b(0))),
                ),
                step("the same datagram again", dgram(vip, 53, w, 64, IN), Expect::Tx(dgram(b0, 8080, w, 63, to_b(0)))),
            ],
        ));
    }

    // --- SNAT (NodePort, eTP Cluster) ---
    rows.push(row(
        "nodeport_masquerade_rewrites_source_to_snat_address_and_worker_port",
        f,
        spec(f, vec![]),
        vec![
            step(
                "SYN to node:30080",
                tcp(c, 40000, f.node, 30080, SYN, 64, IN),
                Expect::Tx(tcp(f.snat, 1024, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "reply to SNAT:1024 goes back to the client from node:30080",
                tcp(b0, 8080, f.snat, 1024, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(f.node, 30080, c, 40000, SYN | ACK, 63, OUT)),
            ),
            step(
                "a second client gets the next SNAT port",
                tcp(f.client2, 40000, f.node, 30080, SYN, 64, IN),
                Expect::Tx(tcp(f.snat, 1025, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "an untracked packet to the SNAT address is dropped",
                tcp(b0, 8080, f.snat, 1999, ACK, 64, from_b(0)),
                Expect::Drop(DropReason::SnatUntracked),
            ),
        ],
    ));

    // --- Hairpin (NAT-03) ---
    rows.push(row(
        "hairpin_backend_reaching_its_own_service_is_masqueraded",
        f,
        spec(f, vec![]),
        vec![step(
            "backend 0 connects to its own VIP",
            tcp(b0, 33000, vip, 80, SYN, 64, from_b(0)),
            Expect::Tx(tcp(f.snat, 1024, b0, 8080, SYN, 63, to_b(0))),
        )],
    ));

    // --- Off-cluster ClusterIP traffic (NAT-06) ---
    let mut cidr_spec = spec(f, vec![]);
    cidr_spec.cluster_cidrs = vec![Cidr { addr: c, len: if f.v6 { 128 } else { 32 } }];
    rows.push(row(
        "clusterip_from_outside_the_cluster_cidr_is_masqueraded_from_inside_keeps_the_client_ip",
        f,
        cidr_spec,
        vec![
            step(
                "SYN from a source inside the cluster CIDR: DNAT only",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "SYN from a source outside it: masqueraded",
                tcp(f.client2, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(f.snat, 1024, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "the reply to the SNAT port goes back to the outside client from the VIP",
                tcp(b0, 8080, f.snat, 1024, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, f.client2, 40000, SYN | ACK, 63, OUT)),
            ),
            step(
                "a NodePort frontend is masqueraded as before (eTP Cluster)",
                tcp(c, 40001, f.node, 30080, SYN, 64, IN),
                Expect::Tx(tcp(f.snat, 1025, b0, 8080, SYN, 63, to_b(0))),
            ),
        ],
    ));

    // --- DSR ---
    let dsr = |mode| {
        spec(
            f,
            vec![service(
                "default/dsr:http",
                vec![Frontend::new(vip, L4Proto::Tcp, 80, FrontendKind::LoadBalancer, false)],
                vec![local_backend(b0, 80)],
                mode,
            )],
        )
    };
    let syn = tcp(c, 40000, vip, 80, SYN, 64, IN);
    rows.push(row(
        "dsr_l2_rewrites_only_the_macs_and_ttl",
        f,
        dsr(ForwardingMode::DsrL2),
        vec![
            step("SYN", syn.clone(), Expect::Tx(tcp(c, 40000, vip, 80, SYN, 63, to_b(0)))),
            step(
                "the ACK after it is rewritten from the flow's record",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, vip, 80, ACK, 63, to_b(0))),
            ),
        ],
    ));
    rows.push(row(
        "dsr_ipip_encapsulates_to_the_backend",
        f,
        dsr(ForwardingMode::DsrIpip),
        vec![
            step("SYN", syn.clone(), Expect::Tx(ipip(f, &tcp(c, 40000, vip, 80, SYN, 63, IN), b0, BMAC[0], 40000))),
            step(
                "the ACK after it is encapsulated from the flow's record",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(ipip(f, &tcp(c, 40000, vip, 80, ACK, 63, IN), b0, BMAC[0], 40000)),
            ),
        ],
    ));
    if !f.v6 {
        // A 1480-byte-payload packet with DF does not fit in 1500 after 20 bytes of IPIP.
        let big = {
            let seg = tcp_segment(40000, 80, ACK, 1, 1, &[0x61; 1460]);
            Frame::ip(c, vip, proto::TCP, &seg, &opts(64)).bytes
        };
        let want = {
            // frag needed, MTU 1480, quoting as much as fits in 576 bytes
            let q = &big[14..14 + 548];
            let mut fr = Frame::ip(vip, c, proto::ICMP, &icmp_message(3, 4, [0, 0, 0x05, 0xc8], q), &opts(64));
            fr.bytes[18..20].copy_from_slice(&[0, 0]);
            fr.bytes[20] = 0;
            ipv4_header_checksum(&mut fr.bytes, 20);
            fr.macs(LB_MAC, CLIENT_MAC);
            fr.bytes
        };
        rows.push(row(
            "dsr_ipip_too_big_with_df_answers_fragmentation_needed",
            f,
            dsr(ForwardingMode::DsrIpip),
            vec![
                step("oversized DF packet", big.clone(), Expect::Tx(want)),
                // No error answers a link-layer broadcast (RFC 1812 §4.3.2.7), and none is
                // taken from the worker's budget for it.
                step(
                    "the same sent as a link-layer broadcast",
                    {
                        let mut b = big;
                        b[..6].fill(0xff);
                        b
                    },
                    Expect::Drop(DropReason::IcmpErrorForbidden),
                ),
            ],
        ));
    }

    // --- Reject and drop when there are no endpoints ---
    let empty = |when| {
        let mut s = service(
            "default/empty:http",
            vec![Frontend::new(vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
            vec![],
            ForwardingMode::Nat,
        );
        s.when_empty = when;
        spec(f, vec![s])
    };
    let syn = tcp(c, 40000, vip, 80, SYN, 64, IN);
    let unreach = |input: &[u8]| {
        let hl = if f.v6 { 40 } else { 20 };
        let q = &input[14..];
        let mut fr = Frame::ip(
            vip,
            c,
            if f.v6 { proto::ICMPV6 } else { proto::ICMP },
            &icmp_message(if f.v6 { 1 } else { 3 }, if f.v6 { 4 } else { 3 }, [0; 4], q),
            &opts(64),
        );
        if !f.v6 {
            fr.bytes[18..20].copy_from_slice(&[0, 0]);
            fr.bytes[20] = 0;
            ipv4_header_checksum(&mut fr.bytes, hl);
        }
        fr.macs(LB_MAC, CLIENT_MAC);
        fr.bytes
    };
    rows.push(row(
        "service_without_endpoints_rejects_with_port_unreachable",
        f,
        empty(EmptyAction::Reject),
        vec![step("SYN", syn.clone(), Expect::Tx(unreach(&syn)))],
    ));
    rows.push(row(
        "local_policy_without_local_endpoints_drops",
        f,
        empty(EmptyAction::Drop),
        vec![step("SYN", syn.clone(), Expect::Drop(DropReason::NoEndpointsDrop))],
    ));
    let other_port = tcp(c, 40000, vip, 81, SYN, 64, IN);
    rows.push(row(
        "clusterip_on_an_unknown_port_is_rejected",
        f,
        spec(f, vec![]),
        vec![step("SYN to :81", other_port.clone(), Expect::Tx(unreach(&other_port)))],
    ));

    // --- Pass to the kernel ---
    rows.push(row(
        "traffic_not_for_a_vip_passes_to_the_kernel",
        f,
        spec(f, vec![]),
        vec![
            step("SSH to the node", tcp(c, 40000, f.node, 22, SYN, 64, IN), Expect::Pass),
            step(
                "ping to the VIP",
                {
                    let pr = if f.v6 { proto::ICMPV6 } else { proto::ICMP };
                    let ty = if f.v6 { 128 } else { 8 };
                    Frame::ip(c, vip, pr, &icmp_message(ty, 0, [0, 1, 0, 1], b"ping"), &opts(64)).bytes
                },
                Expect::Pass,
            ),
        ],
    ));

    // --- loadBalancerSourceRanges ---
    let mut ranged = service(
        "default/lb:http",
        vec![Frontend::new(f.lbip, L4Proto::Tcp, 80, FrontendKind::LoadBalancer, false)],
        vec![local_backend(b0, 8080)],
        ForwardingMode::Nat,
    );
    ranged.frontends[0].source_ranges = vec![Cidr { addr: f.client2, len: if f.v6 { 128 } else { 32 } }];
    rows.push(row(
        "source_ranges_admit_listed_clients_and_drop_others",
        f,
        spec(f, vec![ranged]),
        vec![
            step(
                "client outside the ranges",
                tcp(c, 40000, f.lbip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::SourceRangeDenied),
            ),
            step(
                "client inside the ranges",
                tcp(f.client2, 40000, f.lbip, 80, SYN, 64, IN),
                Expect::Tx(tcp(f.client2, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
        ],
    ));

    // --- Two frontends, one backend: the same client port to both meets one reply tuple ---
    rows.push(row(
        "an_established_flow_keeps_its_reply_tuple_and_a_new_flow_with_the_same_one_is_dropped",
        f,
        two_frontends_one_backend(f),
        vec![
            step(
                "SYN to the ClusterIP",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "SYN-ACK from the backend",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, c, 40000, SYN | ACK, 63, OUT)),
            ),
            step(
                "ACK: established",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
            step(
                "SYN from the same client port to the LB IP, same backend: same reply tuple",
                tcp(c, 40000, f.lbip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::ReplyTupleInUse),
            ),
            step(
                "the backend's packets still reach the client from the ClusterIP",
                tcp(b0, 8080, c, 40000, ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, c, 40000, ACK, 63, OUT)),
            ),
            step(
                "and the client's from the ClusterIP still reach the backend",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
        ],
    ));
    rows.push(row(
        "a_new_flow_takes_the_reply_tuple_of_a_flow_not_yet_established",
        f,
        two_frontends_one_backend(f),
        vec![
            step(
                "SYN to the ClusterIP",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "SYN from the same client port to the LB IP, same backend",
                tcp(c, 40000, f.lbip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "the backend's SYN-ACK goes back from the LB IP",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(f.lbip, 80, c, 40000, SYN | ACK, 63, OUT)),
            ),
        ],
    ));

    // --- Backend removal: TCP gets a RST, UDP is re-balanced ---
    let two = |list: &[usize]| {
        spec(
            f,
            vec![service(
                "default/web:http",
                vec![
                    Frontend::new(vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false),
                    Frontend::new(vip, L4Proto::Udp, 53, FrontendKind::ClusterIp, false),
                ],
                list.iter().map(|&i| local_backend(f.backends[i], 8080)).collect(),
                ForwardingMode::Nat,
            )],
        )
    };
    let rst = {
        // RST from the VIP: the client's ACK carried ack=7000, so the RST has seq=7000.
        let seg = tcp_segment(80, 40000, RST, 7000, 0, &[]);
        let mut fr = Frame::ip(vip, c, proto::TCP, &seg, &opts(64));
        if !f.v6 {
            fr.bytes[18..20].copy_from_slice(&[0, 0]);
            fr.bytes[20] = 0;
            ipv4_header_checksum(&mut fr.bytes, 20);
        }
        // the generated RST carries window 0
        let l4 = if f.v6 { 54 } else { 34 };
        fr.bytes[l4 + 14..l4 + 16].fill(0);
        let (s, d) = (
            &fr.bytes[if f.v6 { 22 } else { 26 }..if f.v6 { 38 } else { 30 }].to_vec(),
            &fr.bytes[if f.v6 { 38 } else { 30 }..if f.v6 { 54 } else { 34 }].to_vec(),
        );
        build::fill_l4(&mut fr.bytes[l4..], s, d, proto::TCP, f.v6);
        fr.macs(LB_MAC, CLIENT_MAC);
        fr.bytes
    };
    // --- Kernel routes: a backend no route reaches is a counted drop, never tracked ---
    // Round robin over backends 0 and 1; the kernel routes reach only backend 1. The first SYN
    // picks backend 0 and is dropped untracked, so the retransmitted SYN is scheduled again
    // (backend 1) instead of finding a flow pinned to the unreachable backend.
    let mut routed = two(&[0, 1]);
    let host = Cidr { addr: f.backends[1], len: if f.v6 { 128 } else { 32 } };
    routed.kernel_routes = vec![KernelRouteSpec { dst: host, gateways: vec![], metric: 0, kernel: false }];
    rows.push(row(
        "backend_without_a_route_is_a_counted_drop_and_gets_no_conntrack_entry",
        f,
        routed,
        vec![
            step(
                "SYN scheduled to backend 0, which no route reaches",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::NoRoute),
            ),
            step(
                "the retransmitted SYN is scheduled again, to backend 1",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, f.backends[1], 8080, SYN, 63, to_b(1))),
            ),
        ],
    ));
    rows.push(row(
        "tcp_flow_to_a_removed_backend_gets_a_reset",
        f,
        two(&[0]),
        vec![
            step("SYN", tcp(c, 40000, vip, 80, SYN, 64, IN), Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0)))),
            Step {
                what: "ACK after backend 0 left the tables",
                retable: Some(two(&[1])),
                advance_s: 0,
                input: tcp(c, 40000, vip, 80, ACK, 64, IN),
                expect: Expect::Tx(rst),
            },
            step(
                "the client's new SYN goes to the surviving backend",
                tcp(c, 40001, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40001, f.backends[1], 8080, SYN, 63, to_b(1))),
            ),
        ],
    ));
    rows.push(row(
        "a_syn_on_the_tuple_of_a_closing_flow_whose_backend_left_is_a_new_flow_to_a_backend_that_is_there",
        f,
        two(&[0]),
        vec![
            step("SYN", tcp(c, 40000, vip, 80, SYN, 64, IN), Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0)))),
            step("ACK", tcp(c, 40000, vip, 80, ACK, 64, IN), Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0)))),
            step(
                "FIN: closing",
                tcp(c, 40000, vip, 80, FIN | ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, FIN | ACK, 63, to_b(0))),
            ),
            Step {
                what: "a new SYN from the same port after backend 0 left: the surviving backend, no RST",
                retable: Some(two(&[1])),
                advance_s: 0,
                input: tcp(c, 40000, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40000, f.backends[1], 8080, SYN, 63, to_b(1))),
            },
        ],
    ));
    rows.push(row(
        "udp_flow_to_a_removed_backend_is_rebalanced_at_once",
        f,
        two(&[0]),
        vec![
            step("query", udp(c, 5000, vip, 53, 64, IN), Expect::Tx(udp(c, 5000, b0, 8080, 63, to_b(0)))),
            Step {
                what: "next query after backend 0 left",
                retable: Some(two(&[1])),
                advance_s: 0,
                input: udp(c, 5000, vip, 53, 64, IN),
                expect: Expect::Tx(udp(c, 5000, f.backends[1], 8080, 63, to_b(1))),
            },
        ],
    ));
    // --- A Service's external frontend merging into / splitting from its internal spec ---
    // (translate's `…/external` spec: a Local policy on one side). The flow keeps its backend
    // although the slot it was created with is freed or moved.
    let internal_fe = || Frontend::new(vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false);
    let external_fe = || Frontend::new(f.lbip, L4Proto::Tcp, 80, FrontendKind::LoadBalancer, false);
    let backends = |list: &[usize]| list.iter().map(|&i| local_backend(f.backends[i], 8080)).collect::<Vec<_>>();
    let split = |external: &[usize]| {
        spec(
            f,
            vec![
                service("default/web:http", vec![internal_fe()], backends(&[0, 1]), ForwardingMode::Nat),
                service("default/web:http/external", vec![external_fe()], backends(external), ForwardingMode::Nat),
            ],
        )
    };
    let merged = || {
        spec(
            f,
            vec![service(
                "default/web:http",
                vec![internal_fe(), external_fe()],
                backends(&[0, 1]),
                ForwardingMode::Nat,
            )],
        )
    };
    rows.push(row(
        "flow_keeps_its_backend_when_the_external_frontend_merges_into_the_internal_spec",
        f,
        split(&[0]),
        vec![
            step(
                "SYN to the LoadBalancer IP (external spec, backend 0 only)",
                tcp(c, 40000, f.lbip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            Step {
                what: "ACK after the external spec merged into the internal one (its slots freed)",
                retable: Some(merged()),
                advance_s: 0,
                input: tcp(c, 40000, f.lbip, 80, ACK, 64, IN),
                expect: Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            },
            step(
                "the backend's reply still leaves from the LoadBalancer IP",
                tcp(b0, 8080, c, 40000, ACK, 64, from_b(0)),
                Expect::Tx(tcp(f.lbip, 80, c, 40000, ACK, 63, OUT)),
            ),
        ],
    ));
    rows.push(row(
        "flow_keeps_its_backend_when_the_external_frontend_splits_from_the_internal_spec",
        f,
        merged(),
        vec![
            step(
                "SYN to the LoadBalancer IP (one spec, backends 0 and 1)",
                tcp(c, 40000, f.lbip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            Step {
                what: "ACK after the external frontend moved to its own spec without backend 0",
                retable: Some(split(&[1])),
                advance_s: 0,
                input: tcp(c, 40000, f.lbip, 80, ACK, 64, IN),
                expect: Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            },
            step(
                "a new connection to the LoadBalancer IP gets the external spec's backend",
                tcp(c, 40001, f.lbip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40001, f.backends[1], 8080, SYN, 63, to_b(1))),
            ),
        ],
    ));
    let mut draining = two(&[0, 1]);
    let drained = &mut Arc::make_mut(&mut draining.services[0]).backends[0];
    drained.eligible = false;
    drained.conditions = Conditions { ready: false, serving: true, terminating: true };
    rows.push(row(
        "terminating_serving_backend_keeps_its_flows_and_gets_no_new_ones",
        f,
        two(&[0]),
        vec![
            step("SYN", tcp(c, 40000, vip, 80, SYN, 64, IN), Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0)))),
            Step {
                what: "existing flow stays on the terminating backend",
                retable: Some(draining),
                advance_s: 0,
                input: tcp(c, 40000, vip, 80, ACK, 64, IN),
                expect: Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            },
            step(
                "new flows go to the ready backend",
                tcp(c, 40002, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40002, f.backends[1], 8080, SYN, 63, to_b(1))),
            ),
        ],
    ));

    // --- Session affinity (AFF-01..04) ---
    let mut aff = two(&[0, 1, 2]);
    Arc::make_mut(&mut aff.services[0]).affinity_timeout_s = Some(10);
    rows.push(row(
        "client_ip_affinity_keeps_a_client_on_one_backend_until_timeout",
        f,
        aff.clone(),
        vec![
            step(
                "first connection (rr picks backend 0)",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "second connection sticks",
                tcp(c, 40001, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40001, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "another client is scheduled normally (rr: backend 1)",
                tcp(f.client2, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(f.client2, 40000, f.backends[1], 8080, SYN, 63, to_b(1))),
            ),
            Step {
                what: "after the timeout the scheduler decides again (rr: backend 2)",
                retable: None,
                advance_s: 11,
                input: tcp(c, 40003, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40003, f.backends[2], 8080, SYN, 63, to_b(2))),
            },
        ],
    ));
    // AFF-04: each new connection restarts the client's timer (kube-proxy's `recent --set`
    // on every DNATed connection), so a client that keeps connecting stays on its backend
    // past the timeout counted from its first connection.
    rows.push(row(
        "client_ip_affinity_timer_restarts_with_each_new_connection",
        f,
        aff.clone(),
        vec![
            step(
                "first connection (rr picks backend 0)",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            Step {
                what: "6 s later a second connection sticks and restarts the 10 s timer",
                retable: None,
                advance_s: 6,
                input: tcp(c, 40001, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40001, b0, 8080, SYN, 63, to_b(0))),
            },
            Step {
                what: "12 s after the first connection, 6 s after the second: still backend 0",
                retable: None,
                advance_s: 6,
                input: tcp(c, 40002, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40002, b0, 8080, SYN, 63, to_b(0))),
            },
        ],
    ));
    // AFF-04: the timeout is checked at each new connection with the Service's current
    // `timeoutSeconds` (kube-proxy's `recent --rcheck --seconds T`), so a lowered or raised
    // timeout applies at once to the clients already recorded.
    let with_timeout = |t: u32| {
        let mut s = aff.clone();
        Arc::make_mut(&mut s.services[0]).affinity_timeout_s = Some(t);
        s
    };
    // AFF-08: a client's recorded backend that starts terminating gets none of its new
    // connections (they are scheduled anew); its open connection stays.
    let mut aff_draining = aff.clone();
    let drained = &mut Arc::make_mut(&mut aff_draining.services[0]).backends[0];
    drained.eligible = false;
    drained.conditions = Conditions { ready: false, serving: true, terminating: true };
    rows.push(row(
        "client_ip_affinity_does_not_send_new_connections_to_a_terminating_backend",
        f,
        aff.clone(),
        vec![
            step(
                "first connection (rr picks backend 0)",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            Step {
                what: "backend 0 terminates: the client's next connection is scheduled (rr: backend 1)",
                retable: Some(aff_draining),
                advance_s: 0,
                input: tcp(c, 40001, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40001, f.backends[1], 8080, SYN, 63, to_b(1))),
            },
            step(
                "the open connection stays on backend 0",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
        ],
    ));
    rows.push(row(
        "client_ip_affinity_follows_a_changed_timeout_at_once",
        f,
        aff.clone(),
        vec![
            step(
                "first connection (rr picks backend 0), 10 s timeout",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            Step {
                what: "timeout lowered to 3 s; 5 s later the record is too old (rr: backend 1)",
                retable: Some(with_timeout(3)),
                advance_s: 5,
                input: tcp(c, 40001, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40001, f.backends[1], 8080, SYN, 63, to_b(1))),
            },
            Step {
                what: "timeout raised to 10 s; 5 s later the record of backend 1 still holds",
                retable: Some(with_timeout(10)),
                advance_s: 5,
                input: tcp(c, 40002, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40002, f.backends[1], 8080, SYN, 63, to_b(1))),
            },
        ],
    ));

    // --- ICMP errors ---
    let reply_to_client = tcp(vip, 80, c, 40000, ACK, 63, OUT);
    let snat_to_backend = tcp(f.snat, 1024, b0, 8080, SYN, 63, to_b(0));
    rows.push(row(
        "icmp_too_big_about_a_reply_reaches_the_backend_that_owns_the_flow",
        f,
        spec(f, vec![]),
        vec![
            step("SYN", tcp(c, 40000, vip, 80, SYN, 64, IN), Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0)))),
            step(
                "a router on the client side reports PMTU for VIP->client",
                icmp_error(f, f.router, vip, &quote(&reply_to_client, f.v6), true, 64, IN),
                Expect::Tx(icmp_error(
                    f,
                    f.router,
                    b0,
                    &quote(&tcp(b0, 8080, c, 40000, ACK, 63, OUT), f.v6),
                    true,
                    63,
                    to_b(0),
                )),
            ),
        ],
    ));
    // A DNAT flow keeps the client's address, so an error about its packet to the backend
    // (the backend's port unreachable, a router's too-big on the backend side) is sent to the
    // client and quotes client -> backend: translated back to client -> VIP (RFC 5508 section
    // 7), from the VIP when the backend itself reports.
    let client_to_backend = tcp(c, 40000, b0, 8080, SYN, 63, to_b(0));
    let client_to_vip = tcp(c, 40000, vip, 80, SYN, 63, IN);
    rows.push(row(
        "icmp_error_about_a_dnat_flows_packet_to_its_backend_reaches_the_client_translated",
        f,
        spec(f, vec![]),
        vec![
            step("SYN", tcp(c, 40000, vip, 80, SYN, 64, IN), Expect::Tx(client_to_backend.clone())),
            step(
                "the backend's port unreachable to the client speaks for the VIP",
                icmp_error(f, b0, c, &quote(&client_to_backend, f.v6), false, 64, from_b(0)),
                Expect::Tx(icmp_error(f, vip, c, &quote(&client_to_vip, f.v6), false, 63, OUT)),
            ),
            step(
                "a router's too-big on the backend side keeps its source",
                icmp_error(f, f.router, c, &quote(&client_to_backend, f.v6), true, 64, from_b(0)),
                Expect::Tx(icmp_error(f, f.router, c, &quote(&client_to_vip, f.v6), true, 63, OUT)),
            ),
        ],
    ));
    // A backend behind a multipath route (gateways: backends 1 and 2, on-link): each flow
    // takes one path by the hash of the flow as it leaves (L4 policy here), and keeps it.
    let mut multi = spec(f, vec![]);
    let host = |a: IpAddr| Cidr { addr: a, len: if f.v6 { 128 } else { 32 } };
    let (g1, g2) = (f.backends[1], f.backends[2]);
    multi.kernel_routes = vec![
        KernelRouteSpec { dst: host(b0), gateways: vec![g1, g2], metric: 0, kernel: false },
        KernelRouteSpec { dst: host(g1), gateways: vec![], metric: 0, kernel: false },
        KernelRouteSpec { dst: host(g2), gateways: vec![], metric: 0, kernel: false },
    ];
    multi.multipath_l4 = true;
    let octets = |a: IpAddr| match a {
        IpAddr::V4(x) => x.octets().to_vec(),
        IpAddr::V6(x) => x.octets().to_vec(),
    };
    let path_of = |port: u16| (multipath_hash(true, &octets(c), &octets(b0), proto::TCP, port, 8080) % 2) as usize;
    let p1 = 40000;
    let p2 = (40001..41000).find(|p| path_of(*p) != path_of(p1)).unwrap_or(40001);
    assert_ne!(path_of(p1), path_of(p2), "two client ports on different paths");
    let gw_mac = |port: u16| (LB_MAC, BMAC[1 + path_of(port)]);
    // Under each kind of scheduler: Maglev's and random's new flows may take the pipeline's
    // direct route, which serves only backends with one next hop: a backend behind a multipath
    // route must take the general one.
    for (sched, name) in [
        (
            Scheduler::RoundRobin,
            "flows_to_a_backend_behind_a_multipath_route_are_spread_over_its_paths_and_keep_theirs",
        ),
        (
            Scheduler::Maglev { port: false },
            "maglev_flows_to_a_backend_behind_a_multipath_route_are_spread_over_its_paths",
        ),
        (Scheduler::Random, "random_flows_to_a_backend_behind_a_multipath_route_are_spread_over_its_paths"),
    ] {
        let mut multi = multi.clone();
        for s in &mut multi.services {
            Arc::make_mut(s).scheduler = sched;
        }
        rows.push(row(
            name,
            f,
            multi,
            vec![
                step(
                    "first flow's SYN: its path",
                    tcp(c, p1, vip, 80, SYN, 64, IN),
                    Expect::Tx(tcp(c, p1, b0, 8080, SYN, 63, gw_mac(p1))),
                ),
                step(
                    "second flow's SYN: the other path",
                    tcp(c, p2, vip, 80, SYN, 64, IN),
                    Expect::Tx(tcp(c, p2, b0, 8080, SYN, 63, gw_mac(p2))),
                ),
                step(
                    "first flow's ACK (fast path): the same path",
                    tcp(c, p1, vip, 80, ACK, 64, IN),
                    Expect::Tx(tcp(c, p1, b0, 8080, ACK, 63, gw_mac(p1))),
                ),
            ],
        ));
    }
    // A backend whose route leaves through an interface xlb does not serve (a pod behind a
    // veth on this node) is handed to the kernel, MACs zero, and not masqueraded even behind a
    // masquerading NodePort: its replies come back from the kernel through xlb's policy rule.
    let mut via_kernel = spec(f, vec![]);
    let any = Cidr { addr: if f.v6 { IpAddr::from([0u16; 8]) } else { IpAddr::from([0u8; 4]) }, len: 0 };
    via_kernel.kernel_routes = vec![KernelRouteSpec { dst: any, gateways: vec![], metric: 0, kernel: true }];
    const KMACS: ([u8; 6], [u8; 6]) = ([0; 6], [0; 6]);
    rows.push(row(
        "backend_behind_the_kernel_is_handed_to_the_kernel_unmasqueraded_and_its_reply_returns",
        f,
        via_kernel,
        vec![
            step(
                "SYN to a masquerading NodePort: DNAT only, to the kernel port",
                tcp(c, 40000, f.node, 30080, SYN, 64, IN),
                Expect::ToKernel(tcp(c, 40000, b0, 8080, SYN, 63, KMACS)),
            ),
            step(
                "the backend's reply, read from the punt device, goes to the client from the NodePort",
                tcp(b0, 8080, c, 40000, ACK, 64, KMACS),
                Expect::Tx(tcp(f.node, 30080, c, 40000, ACK, 63, OUT)),
            ),
        ],
    ));
    rows.push(row(
        "icmp_error_from_the_backend_side_about_a_snat_flow_reaches_the_client",
        f,
        spec(f, vec![]),
        vec![
            step("SYN to NodePort", tcp(c, 40000, f.node, 30080, SYN, 64, IN), Expect::Tx(snat_to_backend.clone())),
            step(
                "backend's port unreachable is translated for the client",
                icmp_error(f, b0, f.snat, &quote(&snat_to_backend, f.v6), false, 64, from_b(0)),
                Expect::Tx(icmp_error(
                    f,
                    f.node,
                    c,
                    &quote(&tcp(c, 40000, f.node, 30080, SYN, 63, IN), f.v6),
                    false,
                    63,
                    OUT,
                )),
            ),
            step(
                "an ICMP error quoting no flow is dropped",
                icmp_error(f, f.router, vip, &quote(&tcp(vip, 80, c, 1, ACK, 63, OUT), f.v6), true, 64, IN),
                Expect::Drop(DropReason::IcmpUntracked),
            ),
        ],
    ));

    // A too-big whose MTU was corrupted on the way (its checksum no longer matches): xlb must
    // not rewrite it under a checksum computed afresh, which would make the backend believe
    // the corrupted MTU (IPVS `ip_vs_in_icmp` and netfilter's `icmp_error` drop it).
    let mut corrupted = icmp_error(f, f.router, vip, &quote(&reply_to_client, f.v6), true, 64, IN);
    let mtu_at = if f.v6 { 54 + 6 } else { 34 + 6 };
    corrupted[mtu_at..mtu_at + 2].copy_from_slice(&[0x00, 0x44]);
    rows.push(row(
        "icmp_error_with_a_bad_checksum_is_dropped_not_forwarded_under_a_fresh_checksum",
        f,
        spec(f, vec![]),
        vec![
            step("SYN", tcp(c, 40000, vip, 80, SYN, 64, IN), Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0)))),
            step("too-big with a corrupted MTU", corrupted, Expect::Drop(DropReason::MalformedL4)),
        ],
    ));
    // No ICMP error to a source that names no single host (RFC 1122 §3.2.2, RFC 1812
    // §4.3.2.7, RFC 4443 §2.4(e)): a spoofed multicast or broadcast source would make the
    // reject an amplifier.
    let mut sources: Vec<IpAddr> = if f.v6 {
        vec![ip6(0xff02, 1).into(), IpAddr::from([0u8; 16])]
    } else {
        vec![[224, 0, 0, 1].into(), [255, 255, 255, 255].into(), [0, 0, 0, 0].into()]
    };
    let mut not_unicast = Vec::new();
    for s in sources.drain(..) {
        not_unicast.push(step(
            "SYN from a source that is no single host to an unknown ClusterIP port",
            tcp(s, 40000, vip, 81, SYN, 64, IN),
            Expect::Drop(DropReason::IcmpErrorForbidden),
        ));
    }
    let mut bcast_mac = tcp(c, 40000, vip, 81, SYN, 64, IN);
    bcast_mac[..6].fill(0xff);
    not_unicast.push(step(
        "SYN sent as a link-layer broadcast to an unknown ClusterIP port",
        bcast_mac,
        Expect::Drop(DropReason::IcmpErrorForbidden),
    ));
    rows.push(row("no_port_unreachable_is_sent_about_a_packet_from_no_single_host", f, spec(f, vec![]), not_unicast));

    // RSS spreads ICMP by addresses alone, so an error seldom reaches the worker whose queue
    // has its flow: like a reply, it goes to the SNAT port's owner, else to the workers in turn.
    let mut two_workers = row(
        "icmp_error_about_a_flow_of_another_worker_is_handed_to_it",
        f,
        spec(f, vec![]),
        vec![
            step(
                "a backend's error about SNAT port 1600 (worker 1's) goes to worker 1",
                icmp_error(
                    f,
                    b0,
                    f.snat,
                    &quote(&tcp(f.snat, 1600, b0, 8080, SYN, 63, to_b(0)), f.v6),
                    false,
                    64,
                    from_b(0),
                ),
                Expect::Handoff(1),
            ),
            step(
                "a too-big about VIP->client of no flow here goes to the next worker",
                icmp_error(f, f.router, vip, &quote(&reply_to_client, f.v6), true, 64, IN),
                Expect::Handoff(1),
            ),
        ],
    );
    two_workers.config.workers = 2;
    rows.push(two_workers);

    if !f.v6 {
        // An error about a later fragment quotes no transport header: the 8 bytes after the
        // quoted IP header are data (here data that looks like the flow's ports), which must
        // not be read as ports nor rewritten (IPVS `ip_vs_in_icmp` leaves such errors alone).
        let mut q = quote(&reply_to_client, false);
        q[6..8].copy_from_slice(&185u16.to_be_bytes()); // offset 1480 bytes
        q[10..12].fill(0);
        let cs = dataplane::csum::checksum(&q[..20]);
        q[10..12].copy_from_slice(&cs.to_be_bytes());
        rows.push(row(
            "icmp_error_quoting_a_later_fragment_is_not_translated",
            f,
            spec(f, vec![]),
            vec![
                step("SYN", tcp(c, 40000, vip, 80, SYN, 64, IN), Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0)))),
                step(
                    "too-big quoting a later fragment of VIP->client",
                    icmp_error(f, f.router, vip, &q, true, 64, IN),
                    Expect::Drop(DropReason::IcmpUntracked),
                ),
            ],
        ));
    }

    // The SNAT address changed while a masqueraded flow lives: the flow keeps the address it
    // was given (its backend's socket is bound to it), and so must an error about it.
    let mut snat_moved = spec(f, vec![]);
    let snat2: IpAddr = if f.v6 { ip6(0xfd00, 0xfd).into() } else { [10, 0, 0, 253].into() };
    if f.v6 {
        snat_moved.snat_v6 = Some(snat2);
    } else {
        snat_moved.snat_v4 = Some(snat2);
    }
    rows.push(row(
        "icmp_error_about_a_masqueraded_flow_quotes_the_snat_address_the_flow_has",
        f,
        spec(f, vec![]),
        vec![
            step("SYN to NodePort", tcp(c, 40000, f.node, 30080, SYN, 64, IN), Expect::Tx(snat_to_backend.clone())),
            Step {
                what: "after the SNAT address changed, a client-side too-big about node->client",
                retable: Some(snat_moved),
                advance_s: 0,
                input: icmp_error(
                    f,
                    f.router,
                    f.node,
                    &quote(&tcp(f.node, 30080, c, 40000, ACK, 63, OUT), f.v6),
                    true,
                    64,
                    IN,
                ),
                expect: Expect::Tx(icmp_error(
                    f,
                    f.router,
                    b0,
                    &quote(&tcp(b0, 8080, f.snat, 1024, ACK, 63, OUT), f.v6),
                    true,
                    63,
                    to_b(0),
                )),
            },
        ],
    ));

    // A source no host has (spoofed: multicast, loopback, unspecified) starts no flow; a
    // router drops it (RFC 1812 §5.3.7). Its backend would answer a group, or itself.
    let martians: [IpAddr; 3] = if f.v6 {
        [ip6(0xff02, 1).into(), "::1".parse().unwrap(), "::".parse().unwrap()]
    } else {
        [[224, 0, 0, 1].into(), [127, 0, 0, 1].into(), [255, 255, 255, 255].into()]
    };
    rows.push(row(
        "a_packet_from_a_martian_source_starts_no_flow",
        f,
        spec(f, vec![]),
        vec![
            step(
                "a SYN from a multicast source",
                tcp(martians[0], 40000, vip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::MartianSource),
            ),
            step(
                "from loopback",
                tcp(martians[1], 40000, vip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::MartianSource),
            ),
            step(
                "a UDP datagram from the broadcast or unspecified address",
                udp(martians[2], 5000, vip, 53, 64, IN),
                Expect::Drop(DropReason::MartianSource),
            ),
            step(
                "a client's SYN after them",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
        ],
    ));

    // --- TTL, malformed ---
    // A router answers a packet whose TTL / hop limit it cannot decrement with "time exceeded
    // in transit" (RFC 1812 §5.3.1; IPVS's decrement_ttl does), here from the VIP, as IPVS,
    // which holds the VIP, does: on a new flow (the direct route), on a known flow's packet
    // (the fast stage leaves it to the slow path), over UDP; not to a link-layer broadcast.
    let time_exceeded = |input: &[u8]| {
        let mut fr = Frame::ip(
            vip,
            c,
            if f.v6 { proto::ICMPV6 } else { proto::ICMP },
            &icmp_message(if f.v6 { 3 } else { 11 }, 0, [0; 4], &input[14..]),
            &opts(64),
        );
        if !f.v6 {
            fr.bytes[18..20].copy_from_slice(&[0, 0]);
            fr.bytes[20] = 0;
            ipv4_header_checksum(&mut fr.bytes, 20);
        }
        fr.macs(LB_MAC, CLIENT_MAC);
        fr.bytes
    };
    let (syn1, ack1, udp1) =
        (tcp(c, 40000, vip, 80, SYN, 1, IN), tcp(c, 40000, vip, 80, ACK, 1, IN), udp(c, 5000, vip, 53, 1, IN));
    let mut broadcast = tcp(c, 40001, vip, 80, SYN, 1, IN);
    broadcast[..6].fill(0xff);
    rows.push(row(
        "ttl_one_is_answered_with_time_exceeded_from_the_vip",
        f,
        spec(f, vec![]),
        vec![
            step("a SYN with TTL 1", syn1.clone(), Expect::Tx(time_exceeded(&syn1))),
            step("its flow's ACK with TTL 1", ack1.clone(), Expect::Tx(time_exceeded(&ack1))),
            step(
                "its flow's ACK with TTL 64 is forwarded",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
            step("a UDP datagram with TTL 1", udp1.clone(), Expect::Tx(time_exceeded(&udp1))),
            step("a SYN with TTL 1 sent to the link-layer broadcast", broadcast, Expect::Drop(DropReason::TtlExceeded)),
        ],
    ));
    // The same on a Maglev service, whose new flows take the slow path's direct route.
    let mut web = standard_web(f);
    web.scheduler = Scheduler::Maglev { port: true };
    rows.push(row(
        "ttl_one_on_the_direct_route_is_answered_with_time_exceeded_from_the_vip",
        f,
        spec(f, vec![web]),
        vec![
            step("a SYN with TTL 1", syn1.clone(), Expect::Tx(time_exceeded(&syn1))),
            step(
                "the same SYN with TTL 64 is forwarded",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step("a UDP datagram with TTL 1", udp1.clone(), Expect::Tx(time_exceeded(&udp1))),
        ],
    ));
    let mut truncated = tcp(c, 40000, vip, 80, SYN, 64, IN);
    let l4 = if f.v6 { 54 } else { 34 };
    truncated[l4 + 12] = 0xf0; // data offset 60 bytes, past the end
    let mut trunc_other = tcp(c, 40000, f.node, 22, SYN, 64, IN);
    trunc_other[l4 + 12] = 0xf0;
    rows.push(row(
        "malformed_l4_to_a_vip_is_dropped_and_to_others_passed",
        f,
        spec(f, vec![]),
        vec![
            step("bad TCP data offset to VIP", truncated, Expect::Drop(DropReason::MalformedL4)),
            step("bad TCP data offset to the node", trunc_other, Expect::Pass),
        ],
    ));

    // --- VLAN ---
    let mut tagged_in = Frame { bytes: tcp(c, 40000, vip, 80, SYN, 64, IN) };
    tagged_in.vlan(100);
    let mut tagged_out = Frame { bytes: tcp(c, 40000, b0, 8080, SYN, 63, to_b(0)) };
    tagged_out.vlan(100);
    rows.push(row(
        "vlan_tagged_frames_keep_their_tag",
        f,
        spec(f, vec![]),
        vec![step("tagged SYN", tagged_in.bytes, Expect::Tx(tagged_out.bytes))],
    ));

    // --- SCTP (CRC32c recomputed on port change) ---
    let sctp_svc = spec(
        f,
        vec![service(
            "default/sig:sctp",
            vec![Frontend::new(vip, L4Proto::Sctp, 3868, FrontendKind::ClusterIp, false)],
            vec![local_backend(b0, 3869)],
            ForwardingMode::Nat,
        )],
    );
    let sctp = |s: IpAddr, sp, d: IpAddr, dp, ttl, macs: ([u8; 6], [u8; 6])| {
        let mut fr = Frame::ip(s, d, proto::SCTP, &sctp_packet(sp, dp, 0xfeed, &[1, 0, 0, 4]), &opts(ttl));
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    rows.push(row(
        "sctp_dnat_recomputes_crc32c",
        f,
        sctp_svc,
        vec![step(
            "SCTP INIT-like packet",
            sctp(c, 5000, vip, 3868, 64, IN),
            Expect::Tx(sctp(c, 5000, b0, 3869, 63, to_b(0))),
        )],
    ));

    // --- Per-worker guards ---
    let mut limited = row(
        "new_flow_rate_guard_drops_flows_over_the_rate",
        f,
        spec(f, vec![]),
        vec![
            step(
                "first new flow this second",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "second new flow this second",
                tcp(c, 40001, vip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::NewFlowRateLimited),
            ),
            step(
                "an established flow is not limited",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
            Step {
                what: "a second later there is budget again",
                retable: None,
                advance_s: 1,
                input: tcp(c, 40002, vip, 80, SYN, 64, IN),
                expect: Expect::Tx(tcp(c, 40002, b0, 8080, SYN, 63, to_b(0))),
            },
        ],
    );
    limited.config.new_flows_per_s = 1;
    rows.push(limited);
    let mut full = row(
        "full_conntrack_refuses_new_flows_but_keeps_existing_ones",
        f,
        spec(f, vec![]),
        vec![
            step(
                "an established flow (picked up mid-stream) fills the one-flow table",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
            step(
                "no room for a second flow: established flows are never evicted early",
                tcp(c, 40001, vip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::ConntrackFull),
            ),
            step(
                "the first flow still works",
                tcp(c, 40000, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, ACK, 63, to_b(0))),
            ),
        ],
    );
    full.config.conntrack_capacity = 1;
    rows.push(full);
    let mut flood = row(
        "syn_on_a_table_full_of_unestablished_flows_evicts_the_oldest_like_early_drop",
        f,
        spec(f, vec![]),
        vec![
            step(
                "a SYN fills the one-flow table",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "the next SYN takes its place (a SYN flood cannot lock new clients out)",
                tcp(c, 40001, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40001, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "the evicted flow's SYN-ACK matches no flow: it goes to the kernel",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Pass,
            ),
        ],
    );
    flood.config.conntrack_capacity = 1;
    rows.push(flood);
    let mut answered = row(
        "syn_answered_by_the_backend_is_still_evictable_until_the_clients_ack",
        f,
        spec(f, vec![]),
        vec![
            step(
                "a SYN (a spoofed source's, say) fills the one-flow table",
                tcp(c, 40000, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40000, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "the backend answers it",
                tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, c, 40000, SYN | ACK, 63, OUT)),
            ),
            step(
                "no ACK came: a new client's SYN still takes its place",
                tcp(c, 40001, vip, 80, SYN, 64, IN),
                Expect::Tx(tcp(c, 40001, b0, 8080, SYN, 63, to_b(0))),
            ),
            step(
                "the new client's handshake completes",
                tcp(b0, 8080, c, 40001, SYN | ACK, 64, from_b(0)),
                Expect::Tx(tcp(vip, 80, c, 40001, SYN | ACK, 63, OUT)),
            ),
            step(
                "its ACK establishes the flow",
                tcp(c, 40001, vip, 80, ACK, 64, IN),
                Expect::Tx(tcp(c, 40001, b0, 8080, ACK, 63, to_b(0))),
            ),
            step(
                "an established flow is not evicted: the next SYN is refused",
                tcp(c, 40002, vip, 80, SYN, 64, IN),
                Expect::Drop(DropReason::ConntrackFull),
            ),
        ],
    );
    answered.config.conntrack_capacity = 1;
    rows.push(answered);

    rows
}

/// A node address that is also an external IP (k3s's ServiceLB reports node addresses as
/// LoadBalancer ingress): the node's own traffic is still the kernel's, later fragments
/// (`later_fragment`, to the node's address) included, with the external IP in the tables
/// from the start and added by a change.
fn node_address_also_an_external_ip_rows(f: Fam, later_fragment: Vec<u8>) -> Vec<Row> {
    let mut node_ext = spec(f, vec![]);
    node_ext.services.push(Arc::new(service(
        "default/ext:http",
        vec![Frontend::new(f.node, L4Proto::Tcp, 80, FrontendKind::ExternalIp, false)],
        vec![local_backend(f.backends[1], 8080)],
        ForwardingMode::Nat,
    )));
    let cases = [("from_the_start", node_ext.clone(), None), ("after_a_change", spec(f, vec![]), Some(node_ext))];
    cases
        .into_iter()
        .map(|(when, setup, retable)| {
            row(
                &format!("a_node_address_that_is_also_an_external_ip_passes_the_nodes_own_fragments_{when}"),
                f,
                setup,
                vec![
                    Step {
                        what: "a later fragment to the node's address, of no flow",
                        retable,
                        advance_s: 0,
                        input: later_fragment.clone(),
                        expect: Expect::Pass,
                    },
                    step(
                        "the external IP's port is still served",
                        tcp(f.client, 40000, f.node, 80, SYN, 64, IN),
                        Expect::Tx(tcp(f.client, 40000, f.backends[1], 8080, SYN, 63, to_b(1))),
                    ),
                ],
            )
        })
        .collect()
}

/// The transport checksum `hc` of an IPv6 datagram to the VIP's port 53, updated per RFC 1624
/// for the rewrite to the first backend's address and port 8080 (what the expected first
/// fragments carry: a fragment's checksum covers the reassembled datagram).
fn dnat_53_to_backend_sum(f: Fam, hc: u16) -> u16 {
    let (IpAddr::V6(vip6), IpAddr::V6(b6)) = (f.vip, f.backends[0]) else { unreachable!() };
    let hc = dataplane::csum::update_bytes(hc, &vip6.octets(), &b6.octets());
    dataplane::csum::update_bytes(hc, &53u16.to_be_bytes(), &8080u16.to_be_bytes())
}

/// IPv6 fragments (Fragment extension header, RFC 8200 §4.5): the first fragment picks the
/// backend; later ones follow it.
fn fragment_rows_v6() -> Vec<Row> {
    let f = v6();
    let c = f.client;
    let frag = |dst: IpAddr, first: bool, ttl: u8, macs: ([u8; 6], [u8; 6]), dport: u16| {
        // Fragment header: next header UDP, offset (in 8-byte units) and M flag, id 0x4242.
        let off_m: u16 = if first { 1 } else { 4 << 3 };
        let om = off_m.to_be_bytes();
        let fh = vec![proto::UDP, 0, om[0], om[1], 0, 0, 0x42, 0x42];
        let payload: Vec<u8> = if first { udp_datagram(5000, dport, &[0x42; 24]) } else { vec![0x42; 16] };
        let o = IpOpts { ttl, v6_ext: vec![(proto::FRAGMENT, fh)], ..IpOpts::default() };
        // Build as "protocol 44 payload" so the builder does not fill a UDP checksum.
        let mut fr = Frame::ip(c, dst, 253, &payload, &o);
        fr.bytes[20] = proto::FRAGMENT; // next header of the fixed header
        fr.bytes[54] = proto::UDP; // next header of the fragment header
        if first {
            // UDP length covers the whole datagram (8 + 24 + 16). The checksum bytes are
            // arbitrary here (a fragment's checksum covers the reassembled datagram); the
            // expected frame carries them updated per RFC 1624 for the new address and port.
            fr.bytes[66..68].copy_from_slice(&48u16.to_be_bytes());
        }
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    let first_in = frag(f.vip, true, 64, IN, 53);
    let mut first_out = frag(f.backends[0], true, 63, to_b(0), 8080);
    let hc = dnat_53_to_backend_sum(f, u16::from_be_bytes([first_in[68], first_in[69]]));
    first_out[68..70].copy_from_slice(&hc.to_be_bytes());
    let mut rows = node_address_also_an_external_ip_rows(f, frag(f.node, false, 64, IN, 53));
    rows.push(row(
        "fragments_follow_their_first_fragment",
        f,
        spec(f, vec![]),
        vec![
            step(
                "later fragment before the first",
                frag(f.vip, false, 64, IN, 53),
                Expect::Drop(DropReason::FragmentUntracked),
            ),
            step("first fragment", first_in, Expect::Tx(first_out)),
            step(
                "later fragment",
                frag(f.vip, false, 64, IN, 53),
                Expect::Tx(frag(f.backends[0], false, 63, to_b(0), 8080)),
            ),
        ],
    ));
    // A first fragment whose checksum field, updated for the new address and port, sums to
    // zero: UDP over IPv6 must carry that as 0xFFFF, since 0 means no checksum, which IPv6
    // receivers discard (RFC 768; RFC 8200 §8.1). The field stands for the whole datagram, so
    // any value is one a sender could have written.
    let hc_in =
        (1..=u16::MAX).find(|&hc| dnat_53_to_backend_sum(f, hc) == 0).expect("a checksum that the rewrite takes to 0");
    let mut zero_in = frag(f.vip, true, 64, IN, 53);
    zero_in[68..70].copy_from_slice(&hc_in.to_be_bytes());
    let mut zero_out = frag(f.backends[0], true, 63, to_b(0), 8080);
    zero_out[68..70].copy_from_slice(&[0xff, 0xff]);
    rows.push(row(
        "a_udp_first_fragment_whose_rewritten_checksum_sums_to_zero_carries_it_as_all_ones",
        f,
        spec(f, vec![]),
        vec![step("first fragment", zero_in, Expect::Tx(zero_out))],
    ));
    // A DNAT reply's series: its later fragment whose hop limit runs out is dropped, not
    // answered (time exceeded answers a client's packet to a VIP from the VIP; a reply's
    // destination, the client, is no address of the node's to answer from).
    let b0 = f.backends[0];
    let rfrag = |src: IpAddr, sport: u16, first: bool, ttl: u8, macs: ([u8; 6], [u8; 6])| {
        let off_m: u16 = if first { 1 } else { 4 << 3 };
        let om = off_m.to_be_bytes();
        let fh = vec![proto::UDP, 0, om[0], om[1], 0, 0, 0x43, 0x43];
        let payload: Vec<u8> = if first { udp_datagram(sport, 5000, &[0x43; 24]) } else { vec![0x43; 16] };
        let o = IpOpts { ttl, v6_ext: vec![(proto::FRAGMENT, fh)], ..IpOpts::default() };
        let mut fr = Frame::ip(src, c, 253, &payload, &o);
        fr.bytes[20] = proto::FRAGMENT;
        fr.bytes[54] = proto::UDP;
        if first {
            fr.bytes[66..68].copy_from_slice(&48u16.to_be_bytes());
        }
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    let (IpAddr::V6(vip6), IpAddr::V6(b6)) = (f.vip, b0) else { unreachable!() };
    let reply_first = rfrag(b0, 8080, true, 64, from_b(0));
    let mut reply_first_out = rfrag(f.vip, 53, true, 63, OUT);
    let hc = u16::from_be_bytes([reply_first[68], reply_first[69]]);
    let hc = dataplane::csum::update_bytes(hc, &b6.octets(), &vip6.octets());
    let hc = dataplane::csum::update_bytes(hc, &8080u16.to_be_bytes(), &53u16.to_be_bytes());
    reply_first_out[68..70].copy_from_slice(&hc.to_be_bytes());
    rows.push(row(
        "a_replys_later_fragment_whose_hop_limit_runs_out_is_dropped_unanswered",
        f,
        spec(f, vec![]),
        vec![
            step(
                "the client's datagram",
                udp(c, 5000, f.vip, 53, 64, IN),
                Expect::Tx(udp(c, 5000, b0, 8080, 63, to_b(0))),
            ),
            step("the backend's first fragment", reply_first, Expect::Tx(reply_first_out)),
            step(
                "its later fragment with hop limit 1",
                rfrag(b0, 8080, false, 1, from_b(0)),
                Expect::Drop(DropReason::TtlExceeded),
            ),
            step(
                "its later fragment with hop limit 64",
                rfrag(b0, 8080, false, 64, from_b(0)),
                Expect::Tx(rfrag(f.vip, 53, false, 63, OUT)),
            ),
        ],
    ));
    rows.extend(fragment_rows_v6_behind_destination_options());
    rows
}

/// IPv6 fragments of a datagram with a Destination Options header in its fragmentable part
/// (RFC 8200 §4.5): every Fragment header's Next Header names that header, and a later
/// fragment holds only payload after its Fragment header, so it must not be read as a chain.
fn fragment_rows_v6_behind_destination_options() -> Vec<Row> {
    let f = v6();
    let c = f.client;
    // Offsets: Fragment header at 54, Destination Options at 62 (first fragment), UDP at 70.
    let frag = |dst: IpAddr, first: bool, ttl: u8, macs: ([u8; 6], [u8; 6]), dport: u16| {
        // The first fragment carries Destination Options (8) + UDP (8) + 24 bytes: 40 bytes,
        // so the later one starts at offset 5 (8-byte units).
        let off_m: u16 = if first { 1 } else { 5 << 3 };
        let om = off_m.to_be_bytes();
        let fh = vec![0, 0, om[0], om[1], 0, 0, 0x42, 0x43];
        let mut ext = vec![(proto::FRAGMENT, fh)];
        if first {
            ext.push((proto::DSTOPTS, vec![0, 0, 1, 4, 0, 0, 0, 0]));
        }
        let payload: Vec<u8> = if first { udp_datagram(5000, dport, &[0x42; 24]) } else { vec![0x42; 16] };
        let o = IpOpts { ttl, v6_ext: ext, ..IpOpts::default() };
        // Built as protocol 253 so the builder fills no UDP checksum.
        let mut fr = Frame::ip(c, dst, 253, &payload, &o);
        fr.bytes[54] = proto::DSTOPTS; // the Fragment header names the fragmentable part's first header
        if first {
            fr.bytes[62] = proto::UDP;
            // UDP length covers the whole datagram (8 + 24 + 16).
            fr.bytes[74..76].copy_from_slice(&48u16.to_be_bytes());
        }
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    let first_in = frag(f.vip, true, 64, IN, 53);
    let mut first_out = frag(f.backends[0], true, 63, to_b(0), 8080);
    let hc = dnat_53_to_backend_sum(f, u16::from_be_bytes([first_in[76], first_in[77]]));
    first_out[76..78].copy_from_slice(&hc.to_be_bytes());
    vec![row(
        "fragments_with_destination_options_after_the_fragment_header_follow_their_first_fragment",
        f,
        spec(f, vec![]),
        vec![
            step("first fragment", first_in, Expect::Tx(first_out)),
            step(
                "later fragment: payload after the Fragment header, whose Next Header is Destination Options",
                frag(f.vip, false, 64, IN, 53),
                Expect::Tx(frag(f.backends[0], false, 63, to_b(0), 8080)),
            ),
        ],
    )]
}

/// IPv6 datagrams behind a Hop-by-Hop Options header (RFC 8200 4.3, a PadN option): DNAT'd
/// whole, and fragmented (the Hop-by-Hop header in the unfragmentable part, before the
/// Fragment header), the later fragment following the first.
fn hop_by_hop_rows_v6() -> Vec<Row> {
    let f = v6();
    let c = f.client;
    let b0 = f.backends[0];
    let hbh = vec![0, 0, 1, 4, 0, 0, 0, 0];
    let frame = |dst: IpAddr, dport: u16, frag: Option<bool>, ttl: u8, macs: ([u8; 6], [u8; 6])| {
        let mut ext = vec![(proto::HOPOPT, hbh.clone())];
        let payload = match frag {
            None => udp_datagram(5000, dport, &[0x42; 24]),
            Some(first) => {
                // The first fragment's 32 bytes, then 16 more at offset 4 (8-byte units).
                let off_m: u16 = if first { 1 } else { 4 << 3 };
                let om = off_m.to_be_bytes();
                ext.push((proto::FRAGMENT, vec![0, 0, om[0], om[1], 0, 0, 0x48, 0x42]));
                if first { udp_datagram(5000, dport, &[0x42; 24]) } else { vec![0x42; 16] }
            }
        };
        let pr = if frag == Some(false) { 253 } else { proto::UDP };
        let mut fr = Frame::ip(c, dst, pr, &payload, &IpOpts { ttl, v6_ext: ext, ..IpOpts::default() });
        if pr == 253 {
            fr.bytes[62] = proto::UDP; // the Fragment header names UDP in every fragment
        }
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    vec![row(
        "datagrams_behind_a_hop_by_hop_header_are_dnatted_whole_and_in_fragments",
        f,
        spec(f, vec![]),
        vec![
            step(
                "a datagram behind Hop-by-Hop",
                frame(f.vip, 53, None, 64, IN),
                Expect::Tx(frame(b0, 8080, None, 63, to_b(0))),
            ),
            step(
                "a first fragment behind Hop-by-Hop",
                frame(f.vip, 53, Some(true), 64, IN),
                Expect::Tx(frame(b0, 8080, Some(true), 63, to_b(0))),
            ),
            step(
                "its later fragment behind Hop-by-Hop",
                frame(f.vip, 53, Some(false), 64, IN),
                Expect::Tx(frame(b0, 8080, Some(false), 63, to_b(0))),
            ),
        ],
    )]
}

/// IPv4 fragments of an IPIP DSR service: a later fragment that the encapsulation makes too
/// big for the next hop's MTU is dropped as its first fragment would be, not sent oversized.
fn dsr_fragment_rows() -> Vec<Row> {
    let f = v4();
    let (c, vip, b0) = (f.client, f.vip, f.backends[0]);
    // A fragment of a UDP datagram of id 0x4243 to vip:53: the first one carries the UDP header
    // and 24 bytes, a later one `len` bytes at offset 32.
    let frag = |first: bool, len: usize, ttl: u8| {
        let payload: Vec<u8> = if first { udp_datagram(5000, 53, &[0x42; 24]) } else { vec![0x42; len] };
        let mut fr = Frame::ip(
            c,
            vip,
            proto::UDP,
            &payload,
            &IpOpts { ttl, dont_frag: false, ident: 0x4243, ..IpOpts::default() },
        );
        if first {
            fr.bytes[20] |= 0x20; // MF
            fr.bytes[38..40].copy_from_slice(&u16::try_from(32 + len).unwrap().to_be_bytes());
            fr.bytes[40..42].fill(0); // checksum off
        } else {
            fr.bytes[20..22].copy_from_slice(&4u16.to_be_bytes()); // offset 32 bytes
            fr.bytes[40..42].fill(0x42); // the builder filled a "UDP checksum" into the data
        }
        ipv4_header_checksum(&mut fr.bytes, 20);
        fr.macs(CLIENT_MAC, LB_MAC);
        fr.bytes
    };
    let first_out = {
        let mut o = Frame::ip(f.dsr, b0, proto::IPIP, &frag(true, 1480, 63)[14..], &opts(64));
        // Identification 0, DF clear as in the inner fragment.
        o.bytes[18..22].fill(0);
        ipv4_header_checksum(&mut o.bytes, 20);
        o.macs(LB_MAC, BMAC[0]);
        o.bytes
    };
    let setup = spec(
        f,
        vec![service(
            "default/dns:dns",
            vec![Frontend::new(vip, L4Proto::Udp, 53, FrontendKind::ClusterIp, false)],
            vec![local_backend(b0, 53)],
            ForwardingMode::DsrIpip,
        )],
    );
    vec![row(
        "dsr_ipip_later_fragment_too_big_for_the_encapsulation_is_dropped_not_sent_oversized",
        f,
        setup,
        vec![
            step("first fragment: 52 bytes, fits after 20 bytes of IPIP", frag(true, 1480, 64), Expect::Tx(first_out)),
            step(
                "later fragment: 1500 bytes, 1520 encapsulated, over the MTU of 1500",
                frag(false, 1480, 64),
                Expect::Drop(DropReason::TooBig),
            ),
            // With DF set, still no "fragmentation needed": no ICMP error about a fragment
            // other than the first (RFC 1812 §4.3.2.7, RFC 1122 §3.2.2).
            step(
                "the same later fragment with DF set",
                {
                    let mut b = frag(false, 1480, 64);
                    b[20] |= 0x40;
                    ipv4_header_checksum(&mut b, 20);
                    b
                },
                Expect::Drop(DropReason::IcmpErrorForbidden),
            ),
        ],
    )]
}

/// IPv4 fragments of SCTP packets. SCTP's CRC32c covers the whole packet (RFC 9260 §6.8), so
/// a port rewrite cannot be folded into a first fragment's CRC as a checksum delta can; a
/// series whose ports stay passes as it is.
fn sctp_fragment_rows() -> Vec<Row> {
    let f = v4();
    let (c, vip, b0) = (f.client, f.vip, f.backends[0]);
    let setup = |bport| {
        spec(
            f,
            vec![service(
                "default/sig:sctp",
                vec![Frontend::new(vip, L4Proto::Sctp, 3868, FrontendKind::ClusterIp, false)],
                vec![local_backend(b0, bport)],
                ForwardingMode::Nat,
            )],
        )
    };
    // A fragment of an SCTP packet of id 0x4244: the first one carries the common header and
    // a 20-byte chunk, a later one 16 bytes at offset 32. The CRC the builder fills into the
    // first fragment's header stands for the whole packet's.
    let fragment = |src: IpAddr,
                    sport: u16,
                    dst: IpAddr,
                    first: bool,
                    ttl: u8,
                    macs: ([u8; 6], [u8; 6]),
                    dport: u16| {
        let payload: Vec<u8> = if first { sctp_packet(sport, dport, 0xfeed, &[0x42; 20]) } else { vec![0x42; 16] };
        let pr = if first { proto::SCTP } else { 253 };
        let mut fr =
            Frame::ip(src, dst, pr, &payload, &IpOpts { ttl, dont_frag: false, ident: 0x4244, ..IpOpts::default() });
        fr.bytes[23] = proto::SCTP;
        fr.bytes[20..22].copy_from_slice(&if first { 0x2000u16 } else { 4 }.to_be_bytes());
        ipv4_header_checksum(&mut fr.bytes, 20);
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    let frag = |dst, first, ttl, macs, dport| fragment(c, 5000, dst, first, ttl, macs, dport);
    vec![
        row(
            "sctp_first_fragment_whose_port_dnat_changes_is_dropped_as_its_crc32c_cannot_follow",
            f,
            setup(3869),
            vec![
                step(
                    "first fragment to vip:3868, backend port 3869",
                    frag(vip, true, 64, IN, 3868),
                    Expect::Drop(DropReason::FragmentUnrewritable),
                ),
                step("its later fragment", frag(vip, false, 64, IN, 3868), Expect::Drop(DropReason::FragmentUntracked)),
                step(
                    "the backend's reply first fragment, whose source port 3869 would become 3868",
                    fragment(b0, 3869, c, true, 64, from_b(0), 5000),
                    Expect::Drop(DropReason::FragmentUnrewritable),
                ),
            ],
        ),
        row(
            "sctp_fragments_whose_ports_stay_keep_their_crc32c_and_follow_their_first_fragment",
            f,
            setup(3868),
            vec![
                step(
                    "first fragment to vip:3868, backend port 3868",
                    frag(vip, true, 64, IN, 3868),
                    Expect::Tx(frag(b0, true, 63, to_b(0), 3868)),
                ),
                step("later fragment", frag(vip, false, 64, IN, 3868), Expect::Tx(frag(b0, false, 63, to_b(0), 3868))),
            ],
        ),
    ]
}

/// IPv4 fragments: the first fragment picks the backend; later ones follow it.
fn fragment_rows() -> Vec<Row> {
    let f = v4();
    let c = f.client;
    // A UDP datagram of 48 bytes in two fragments, from src:sport to dst:dport.
    let frag_of = |src: IpAddr, sport: u16, dst: IpAddr, dport: u16, first: bool, ttl: u8, macs: ([u8; 6], [u8; 6])| {
        let payload: Vec<u8> = if first { udp_datagram(sport, dport, &[0x42; 24]) } else { vec![0x42; 16] };
        let mut fr = Frame::ip(
            src,
            dst,
            proto::UDP,
            &payload,
            &IpOpts { ttl, dont_frag: false, ident: 0x4242, ..IpOpts::default() },
        );
        if first {
            fr.bytes[20] |= 0x20; // MF
            // the UDP length covers the whole datagram (32 + 16 bytes); checksum off
            fr.bytes[38..40].copy_from_slice(&48u16.to_be_bytes());
            fr.bytes[40..42].fill(0);
        } else {
            fr.bytes[20..22].copy_from_slice(&4u16.to_be_bytes()); // offset 32 bytes
            fr.bytes[40..42].fill(0x42); // the builder filled a "UDP checksum" into the data
        }
        ipv4_header_checksum(&mut fr.bytes, 20);
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    let frag = |dst: IpAddr, first: bool, ttl: u8, macs: ([u8; 6], [u8; 6]), dport: u16| {
        frag_of(c, 5000, dst, dport, first, ttl, macs)
    };
    let mut rows = node_address_also_an_external_ip_rows(f, frag(f.node, false, 64, IN, 53));
    // A DNAT reply's datagram fragmented by its backend: its first fragment records the series
    // where the flow is, and the later ones, which carry no ports, follow it to the client.
    let b0 = f.backends[0];
    rows.push(row(
        "a_dnat_replys_later_fragments_follow_its_first_fragment_to_the_client",
        f,
        spec(f, vec![]),
        vec![
            step(
                "the client's datagram",
                udp(c, 5000, f.vip, 53, 64, IN),
                Expect::Tx(udp(c, 5000, b0, 8080, 63, to_b(0))),
            ),
            step(
                "the backend's first fragment",
                frag_of(b0, 8080, c, 5000, true, 64, from_b(0)),
                Expect::Tx(frag_of(f.vip, 53, c, 5000, true, 63, OUT)),
            ),
            step(
                "its later fragment",
                frag_of(b0, 8080, c, 5000, false, 64, from_b(0)),
                Expect::Tx(frag_of(f.vip, 53, c, 5000, false, 63, OUT)),
            ),
        ],
    ));
    // A full fragment table forgets its oldest series for a new one: a flood of first
    // fragments with fresh identifications no longer keeps every other datagram out for the
    // table's timeout, and the flood's own oldest series loses its later fragments.
    let with_ident = |mut fr: Vec<u8>, id: u16| {
        fr[18..20].copy_from_slice(&id.to_be_bytes());
        ipv4_header_checksum(&mut fr, 20);
        fr
    };
    let flood = IpAddr::from([192, 0, 2, 77]);
    let flood_in = |id: u16, first: bool| with_ident(frag_of(flood, 5000, f.vip, 53, first, 64, IN), id);
    let flood_out = |id: u16| with_ident(frag_of(flood, 5000, b0, 8080, true, 63, to_b(0)), id);
    let mut full = row(
        "a_full_fragment_table_forgets_its_oldest_series_for_a_new_one",
        f,
        spec(f, vec![]),
        vec![
            step("a flood's first fragment, series 1", flood_in(1, true), Expect::Tx(flood_out(1))),
            step("its first fragment of series 2: the table is full", flood_in(2, true), Expect::Tx(flood_out(2))),
            step(
                "a client's first fragment is recorded all the same",
                frag(f.vip, true, 64, IN, 53),
                Expect::Tx(frag(b0, true, 63, to_b(0), 8080)),
            ),
            step(
                "the client's later fragment follows it",
                frag(f.vip, false, 64, IN, 53),
                Expect::Tx(frag(b0, false, 63, to_b(0), 8080)),
            ),
            step(
                "the flood's series 1, the oldest, was forgotten",
                flood_in(1, false),
                Expect::Drop(DropReason::FragmentUntracked),
            ),
        ],
    );
    full.config.frag_capacity = 2;
    rows.push(full);
    // An echo request larger than the link: its first fragment and an unfragmented one are the
    // kernel's (xlb answers no echo), and so is a later fragment.
    let mut echo_later = Frame::ip(
        c,
        f.vip,
        proto::ICMP,
        &[0x42; 16],
        &IpOpts { ttl: 64, dont_frag: false, ident: 0x4343, ..IpOpts::default() },
    );
    echo_later.bytes[20..22].copy_from_slice(&185u16.to_be_bytes()); // offset 1,480 bytes
    ipv4_header_checksum(&mut echo_later.bytes, 20);
    echo_later.macs(IN.0, IN.1);
    rows.push(row(
        "a_later_fragment_of_an_echo_request_to_a_vip_goes_to_the_kernel",
        f,
        spec(f, vec![]),
        vec![step("the echo request's later fragment", echo_later.bytes, Expect::Pass)],
    ));
    // RSS puts a reply's later fragments where its first one arrived, which handed that one to
    // the worker of its flow: a series this worker has not seen goes to the next worker,
    // unless it is sent to a VIP (a client's, whose first fragment came to this queue).
    let mut two_workers = row(
        "a_later_fragment_of_a_series_this_worker_has_not_seen_goes_to_the_next_unless_to_a_vip",
        f,
        spec(f, vec![]),
        vec![
            step("a DNAT reply's, to the client", frag_of(b0, 8080, c, 5000, false, 64, from_b(0)), Expect::Handoff(1)),
            step(
                "a SNAT reply's, to the SNAT address",
                frag_of(b0, 8080, f.snat, 1600, false, 64, from_b(0)),
                Expect::Handoff(1),
            ),
            step("a client's, to a VIP", frag(f.vip, false, 64, IN, 53), Expect::Drop(DropReason::FragmentUntracked)),
        ],
    );
    two_workers.config.workers = 2;
    rows.push(two_workers);
    rows.push(row(
        "fragments_follow_their_first_fragment",
        f,
        spec(f, vec![]),
        vec![
            step(
                "later fragment before the first",
                frag(f.vip, false, 64, IN, 53),
                Expect::Drop(DropReason::FragmentUntracked),
            ),
            step(
                "first fragment",
                frag(f.vip, true, 64, IN, 53),
                Expect::Tx(frag(f.backends[0], true, 63, to_b(0), 8080)),
            ),
            step(
                "later fragment",
                frag(f.vip, false, 64, IN, 53),
                Expect::Tx(frag(f.backends[0], false, 63, to_b(0), 8080)),
            ),
        ],
    ));
    rows
}

struct Outcome {
    verdict: Verdict,
    frame: Vec<u8>,
}

/// How a row's packets are handed to the pipeline.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Layout {
    /// Bytes before each frame in its buffer: 0 (encapsulation then moves the packet into
    /// the tailroom), or 256 as in the AF_XDP workers, the kernel's `XDP_PACKET_HEADROOM`
    /// (encapsulation grows into it).
    headroom: usize,
    /// One `Pipeline::process_batch` call for each run of steps between table changes and
    /// clock moves, instead of `Pipeline::process` per step.
    batched: bool,
}

/// Every layout a row runs in; each must give the row's expected frames, so all give the same.
const LAYOUTS: [Layout; 4] = [
    Layout { headroom: HEADROOM, batched: false },
    Layout { headroom: 0, batched: false },
    Layout { headroom: HEADROOM, batched: true },
    Layout { headroom: 0, batched: true },
];

fn run_row(r: &Row) -> (Vec<Outcome>, std::sync::Arc<dataplane::counters::WorkerCounters>) {
    run_row_with(r, LAYOUTS[0])
}

fn run_row_with(r: &Row, layout: Layout) -> (Vec<Outcome>, std::sync::Arc<dataplane::counters::WorkerCounters>) {
    let mut builder = TableBuilder::new();
    let mut tables = builder.build(&r.setup).expect("setup tables build");
    let mut p = Pipeline::new(r.config.clone(), 7);
    let mut now_ms = 1_000;
    let mut out = Vec::new();
    let h = layout.headroom;
    let mut at = 0;
    while at < r.steps.len() {
        let first = &r.steps[at];
        if let Some(spec) = &first.retable {
            tables = builder.build(spec).expect("retable build");
        }
        now_ms += first.advance_s * 1000;
        p.begin_batch(&tables, now_ms);
        // The steps that go together: one, or, batched, up to the next table change or clock move.
        let mut end = at + 1;
        while layout.batched && end < r.steps.len() && r.steps[end].retable.is_none() && r.steps[end].advance_s == 0 {
            end += 1;
        }
        let steps = &r.steps[at..end];
        let mut bufs: Vec<Vec<u8>> = steps
            .iter()
            .map(|s| {
                let mut b = vec![0u8; BUF];
                b[h..h + s.input.len()].copy_from_slice(&s.input);
                b
            })
            .collect();
        let mut pkts: Vec<Packet<'_>> =
            bufs.iter_mut().zip(steps).map(|(b, s)| Packet::new(b, h, s.input.len())).collect();
        let mut verdicts = vec![Verdict::Pass; pkts.len()];
        if layout.batched {
            p.process_batch(&tables, &mut pkts, 0, &mut verdicts);
        } else {
            for (pkt, v) in pkts.iter_mut().zip(verdicts.iter_mut()) {
                *v = p.process(&tables, pkt, 0);
            }
        }
        out.extend(pkts.iter().zip(verdicts).map(|(pkt, verdict)| Outcome { verdict, frame: pkt.frame().to_vec() }));
        at = end;
    }
    (out, p.counters().clone())
}

fn all_rows() -> Vec<Row> {
    let mut rows = rows_for(v4());
    rows.extend(rows_for(v6()));
    rows.extend(fragment_rows());
    rows.extend(fragment_rows_v6());
    rows.extend(hop_by_hop_rows_v6());
    rows.extend(dsr_fragment_rows());
    rows.extend(sctp_fragment_rows());
    rows.extend(mtu_rows(v4()));
    rows.extend(mtu_rows(v6()));
    rows
}

/// MAC of the fixtures' second port (port 1).
const LB_MAC1: [u8; 6] = [0x02, 0, 0, 0, 0, 0xef];

/// Rows of a node whose two ports differ in MTU: the clients on port 0, the backends behind
/// port 1. A NAT packet keeps its size, so it can exceed only the MTU of a port smaller than
/// the one it arrived on; such a packet gets "fragmentation needed" / "packet too big" (RFC
/// 1191, RFC 8201; IPVS's NAT mode does the same) instead of leaving oversized.
fn mtu_rows(f: Fam) -> Vec<Row> {
    let (c, vip, b0) = (f.client, f.vip, f.backends[0]);
    let mut rows = Vec::new();
    // Port 0 (clients) and port 1 (backends) with these MTUs; the web service with
    // `scheduler` (Maglev and random are the schedulers of the direct routes, which such a
    // node does not take: they check no packet's size).
    let setup = |client_mtu: u16, backend_mtu: u16, scheduler: Scheduler| {
        let mut web = service(
            "default/web:http",
            vec![Frontend::new(vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
            vec![local_backend(b0, 8080)],
            ForwardingMode::Nat,
        );
        web.scheduler = scheduler;
        let mut t = spec(f, vec![web]);
        t.ports = vec![
            PortSpec { name: "eth0".into(), mac: LB_MAC, mtu: client_mtu },
            PortSpec { name: "eth1".into(), mac: LB_MAC1, mtu: backend_mtu },
        ];
        for n in &mut t.neighbours {
            n.port = 1;
        }
        t
    };
    // A TCP ACK of `len` bytes of IP packet, DF set (IPv4).
    let sized = |src: IpAddr, sp: u16, dst: IpAddr, dp: u16, ttl: u8, macs: ([u8; 6], [u8; 6]), len: usize| {
        let hl = if f.v6 { 40 } else { 20 };
        let seg = tcp_segment(sp, dp, ACK, 1, 1, &vec![0x61; len - hl - 20]);
        let mut fr = Frame::ip(src, dst, proto::TCP, &seg, &opts(ttl));
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    // 1,600 bytes: more than 1,500.
    let big = |src, sp, dst, dp, ttl, macs| sized(src, sp, dst, dp, ttl, macs, 1600);
    // The error `from` → `to` about `input`, carrying MTU 1500: as much of it as fits in 576
    // (IPv4) or 1,280 (IPv6) bytes.
    let too_big = |from: IpAddr, to: IpAddr, input: &[u8], macs: ([u8; 6], [u8; 6])| {
        let q = &input[14..14 + if f.v6 { 1280 - 48 } else { 576 - 28 }];
        let (pr, ty, code, rest) =
            if f.v6 { (proto::ICMPV6, 2, 0, 1500u32.to_be_bytes()) } else { (proto::ICMP, 3, 4, [0, 0, 0x05, 0xdc]) };
        let mut fr = Frame::ip(from, to, pr, &icmp_message(ty, code, rest, q), &opts(64));
        if !f.v6 {
            fr.bytes[18..20].copy_from_slice(&[0, 0]);
            fr.bytes[20] = 0;
            ipv4_header_checksum(&mut fr.bytes, 20);
        }
        fr.macs(macs.0, macs.1);
        fr.bytes
    };
    let to_b0 = (LB_MAC1, BMAC[0]);
    // The flow's SYN, out on the backends' port, and the backend's SYN-ACK, back on port 0.
    let handshake = || {
        vec![
            step("SYN to VIP:80 leaves on the backends' port", tcp(c, 40000, vip, 80, SYN, 64, IN), {
                Expect::TxOn(1, tcp(c, 40000, b0, 8080, SYN, 63, to_b0))
            }),
            step("SYN-ACK from the backend", tcp(b0, 8080, c, 40000, SYN | ACK, 64, from_b(0)), {
                Expect::Tx(tcp(vip, 80, c, 40000, SYN | ACK, 63, OUT))
            }),
        ]
    };
    let fwd_big = big(c, 40000, vip, 80, 64, IN);
    let mut steps = handshake();
    steps.extend([
        step(
            "a 1,600-byte packet of the flow, too big for the backends' port",
            fwd_big.clone(),
            Expect::Tx(too_big(vip, c, &fwd_big, OUT)),
        ),
        step("an ACK of the flow still leaves on the backends' port", tcp(c, 40000, vip, 80, ACK, 64, IN), {
            Expect::TxOn(1, tcp(c, 40000, b0, 8080, ACK, 63, to_b0))
        }),
    ]);
    if !f.v6 {
        // Without DF a router would fragment it; xlb does not: a counted drop.
        let mut no_df = fwd_big.clone();
        no_df[20] = 0;
        ipv4_header_checksum(&mut no_df, 20);
        steps.push(step("the same without DF", no_df, Expect::Drop(DropReason::TooBig)));
    }
    rows.push(row(
        "a_packet_larger_than_the_backends_smaller_port_is_answered_with_fragmentation_needed",
        f,
        setup(9000, 1500, Scheduler::Maglev { port: true }),
        steps,
    ));
    let reply_big = big(b0, 8080, c, 40000, 64, from_b(0));
    // 1,500 bytes: fits the clients' port.
    let reply_fits = sized(b0, 8080, c, 40000, 64, from_b(0), 1500);
    let reply_fits_out = sized(vip, 80, c, 40000, 63, OUT, 1500);
    rows.push(row(
        "a_reply_larger_than_the_clients_smaller_port_is_answered_with_fragmentation_needed",
        f,
        setup(1500, 9000, Scheduler::Random),
        handshake()
            .into_iter()
            .chain([
                step(
                    "a 1,600-byte reply, too big for the clients' port: the error goes to the backend",
                    reply_big.clone(),
                    Expect::Tx(too_big(c, b0, &reply_big, (LB_MAC, BMAC[0]))),
                ),
                step("a 1,500-byte reply fits", reply_fits, Expect::Tx(reply_fits_out)),
            ])
            .collect(),
    ));
    rows
}

fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| c.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_fixture_row_gives_its_expected_verdict_and_frame_in_every_layout() {
    let mut failures = Vec::new();
    let mut count = 0;
    for layout in LAYOUTS {
        for r in all_rows() {
            for (s, o) in r.steps.iter().zip(run_row_with(&r, layout).0) {
                count += 1;
                let ok = match &s.expect {
                    Expect::Tx(want) => o.verdict == (Verdict::Tx { port: 0 }) && o.frame == *want,
                    Expect::TxOn(port, want) => o.verdict == (Verdict::Tx { port: *port }) && o.frame == *want,
                    Expect::ToKernel(want) => o.verdict == (Verdict::Tx { port: KERNEL_PORT }) && o.frame == *want,
                    Expect::Pass => o.verdict == Verdict::Pass && o.frame == s.input,
                    Expect::Drop(reason) => o.verdict == Verdict::Drop(*reason),
                    Expect::Handoff(w) => o.verdict == Verdict::Handoff { worker: *w } && o.frame == s.input,
                };
                if !ok {
                    let detail = match &s.expect {
                        Expect::Tx(want) | Expect::TxOn(_, want) | Expect::ToKernel(want) => {
                            format!("\n want frame:\n{}\n got frame:\n{}", hex(want), hex(&o.frame))
                        }
                        _ => String::new(),
                    };
                    failures.push(format!(
                        "{} / {} ({layout:?}): want {:?}, got {:?}{}",
                        r.name,
                        s.what,
                        short(&s.expect),
                        o.verdict,
                        detail
                    ));
                }
                if let (Expect::Tx(_) | Expect::TxOn(..), Err(e)) = (&s.expect, build::verify(&o.frame)) {
                    failures.push(format!("{} / {} ({layout:?}): output checksum: {e}", r.name, s.what));
                }
            }
        }
    }
    assert!(count > 4 * 60, "only {count} fixture steps");
    assert!(failures.is_empty(), "{} of {count} fixture steps failed:\n{}", failures.len(), failures.join("\n\n"));
}

/// The batched layouts really batch: rows whose steps share one batch are there to show that
/// per-flow order holds inside a batch (a SYN and its ACK, a flow and its reply).
#[test]
fn batched_layouts_put_several_steps_of_a_row_in_one_batch() {
    let multi = all_rows()
        .iter()
        .filter(|r| r.steps.len() > 1 && r.steps.iter().skip(1).any(|s| s.retable.is_none() && s.advance_s == 0))
        .count();
    assert!(multi > 20, "only {multi} rows have steps that share a batch");
}

fn short(e: &Expect) -> String {
    match e {
        Expect::Tx(_) => "Tx".into(),
        Expect::TxOn(port, _) => format!("Tx({port})"),
        Expect::ToKernel(_) => "ToKernel".into(),
        Expect::Pass => "Pass".into(),
        Expect::Drop(r) => format!("Drop({r:?})"),
        Expect::Handoff(w) => format!("Handoff({w})"),
    }
}

#[test]
fn counters_account_for_every_frame_and_count_events() {
    let mut rx = 0;
    for r in all_rows() {
        let (_, k) = run_row(&r);
        let drops: u64 = DropReason::ALL.iter().map(|d| k.drops_of(*d)).sum();
        let handed_off = k.events_of(Event::HandedOff);
        assert_eq!(k.rx.get(), k.tx.get() + k.pass.get() + drops + handed_off, "{}", r.name);
        assert_eq!(k.rx.get(), r.steps.len() as u64, "{}", r.name);
        rx += k.rx.get();
        if r.name.ends_with(
            "a_syn_on_the_tuple_of_a_closing_flow_whose_backend_left_is_a_new_flow_to_a_backend_that_is_there",
        ) {
            assert_eq!(k.events_of(Event::FlowReused), 1, "{}", r.name);
            assert_eq!(k.events_of(Event::RstBackendGone), 0, "{}", r.name);
        }
        if r.name.ends_with("tcp_flow_to_a_removed_backend_gets_a_reset") {
            assert_eq!(k.events_of(Event::RstBackendGone), 1);
            assert_eq!(k.events_of(Event::FlowRebound), 0, "a backend that left is not found again");
        }
        if r.name.ends_with("backend_without_a_route_is_a_counted_drop_and_gets_no_conntrack_entry") {
            assert_eq!(k.drops_of(DropReason::NoRoute), 1, "{}", r.name);
            assert_eq!(k.events_of(Event::NewFlow), 1, "only the second SYN makes a flow: {}", r.name);
        }
        if r.name.ends_with("flow_keeps_its_backend_when_the_external_frontend_merges_into_the_internal_spec") {
            assert_eq!(k.events_of(Event::FlowRebound), 1, "{}", r.name);
            assert_eq!(k.events_of(Event::RstBackendGone), 0, "{}", r.name);
        }
        if r.name.ends_with(
            "a_backends_syn_ack_on_the_reply_tuple_of_a_closing_flow_is_the_kernels_and_the_flow_is_forgotten",
        ) {
            assert_eq!(k.events_of(Event::ReplyTupleReused), 1, "{}", r.name);
            assert_eq!(k.events_of(Event::NewFlow), 2, "{}", r.name);
        }
        if r.name.ends_with("service_without_endpoints_rejects_with_port_unreachable") {
            assert_eq!(k.events_of(Event::RejectSent), 1);
        }
    }
    assert!(rx > 60);
}

/// Writes or checks the pcap copies of the fixture corpus.
#[test]
fn pcap_copies_of_the_fixtures_are_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut inputs = Vec::new();
    let mut expected = Vec::new();
    // advance_s and retable: the step's clock step (seconds) and whether the tables change
    // before it, so a replay (control/tests/trace.rs) can tell which rows it can express.
    let mut index = String::from("record\trow\tstep\texpected_verdict\tadvance_s\tretable\n");
    let mut n = 0;
    for r in all_rows() {
        for s in &r.steps {
            inputs.push(s.input.clone());
            expected.push(match &s.expect {
                Expect::Tx(f) | Expect::TxOn(_, f) | Expect::ToKernel(f) => f.clone(),
                Expect::Pass | Expect::Handoff(_) => s.input.clone(),
                Expect::Drop(_) => Vec::new(),
            });
            index.push_str(&format!(
                "{n}\t{}\t{}\t{}\t{}\t{}\n",
                r.name,
                s.what,
                short(&s.expect),
                s.advance_s,
                u8::from(s.retable.is_some())
            ));
            n += 1;
        }
    }
    let files = [("inputs.pcap", pcap(&inputs)), ("expected.pcap", pcap(&expected)), ("index.tsv", index.into_bytes())];
    if std::env::var_os("XLB_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    for (name, bytes) in &files {
        let on_disk = std::fs::read(dir.join(name)).unwrap_or_default();
        assert!(
            on_disk == *bytes,
            "tests/fixtures/{name} is stale: run XLB_BLESS=1 cargo test -p dataplane --test fixtures"
        );
    }
}

/// A classic pcap file (LINKTYPE_ETHERNET, microsecond timestamps; one record per frame,
/// empty records for dropped packets), written with the `pcap-file` crate.
fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    let mut out = Vec::new();
    let header = PcapHeader { datalink: pcap_file::DataLink::ETHERNET, ..PcapHeader::default() };
    {
        let mut w = PcapWriter::with_header(&mut out, header).unwrap();
        for (i, f) in frames.iter().enumerate() {
            let ts = std::time::Duration::from_secs(i as u64);
            w.write_packet(&PcapPacket::new(ts, f.len() as u32, f)).unwrap();
        }
    }
    out
}

// ---- hand-over and pickup (issue 11) ---------------------------------------------------------

/// Runs `frames` through `p` one at a time; returns each verdict and output frame.
fn run_frames(p: &mut Pipeline, t: &Tables, frames: &[Vec<u8>]) -> Vec<(Verdict, Vec<u8>)> {
    frames
        .iter()
        .map(|f| {
            let mut b = vec![0u8; BUF];
            b[..f.len()].copy_from_slice(f);
            let mut pkt = Packet::new(&mut b, 0, f.len());
            let v = p.process(t, &mut pkt, 0);
            (v, pkt.frame().to_vec())
        })
        .collect()
}

/// The TCP source port of an Ethernet + IP (no options) + TCP frame.
fn tcp_sport(frame: &[u8], v6: bool) -> u16 {
    let l4 = 14 + if v6 { 40 } else { 20 };
    u16::from_be_bytes([frame[l4], frame[l4 + 1]])
}

/// A hand-over (`xlb run --takeover`): flows made by one pipeline are exported, encoded,
/// decoded and imported into a pipeline of another "process" (other seed, tables built by
/// another builder from a spec whose service and backend order differs), which then rewrites
/// their later packets and replies byte for byte as the first pipeline does — the DNAT flow
/// and the SNAT flow with its SNAT port — without making a new flow.
#[test]
fn flows_handed_over_to_a_new_pipeline_continue_byte_for_byte() {
    for f in [v4(), v6()] {
        let cfg = PipelineConfig { conntrack_capacity: 1024, snat_ports: (1024, 2047), ..PipelineConfig::default() };
        let setup = spec(f, vec![]);
        // The new process's tables: another Service first, so service ids and backend slots differ.
        let mut other = setup.clone();
        other.services.insert(
            0,
            Arc::new(service(
                "default/other:http",
                vec![Frontend::new(f.vip, L4Proto::Tcp, 81, FrontendKind::ClusterIp, false)],
                vec![local_backend(f.backends[1], 9090), local_backend(f.backends[2], 9090)],
                ForwardingMode::Nat,
            )),
        );
        let t_old = TableBuilder::new().build(&setup).unwrap();
        let t_new = TableBuilder::new().build(&other).unwrap();
        let syns = [tcp(f.client, 40000, f.vip, 80, SYN, 64, IN), tcp(f.client, 40001, f.node, 30080, SYN, 64, IN)];
        // The old process: two flows, then what it does with their next packets.
        let mut old = Pipeline::new(cfg.clone(), 7);
        old.begin_batch(&t_old, 1_000);
        let made = run_frames(&mut old, &t_old, &syns);
        assert!(made.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }), "{made:?}");
        let snat_port = tcp_sport(&made[1].1, f.v6);
        assert_ne!(snat_port, 40001, "the NodePort flow is masqueraded");
        let later = [
            tcp(f.client, 40000, f.vip, 80, ACK, 64, IN),
            tcp(f.backends[0], 8080, f.client, 40000, ACK, 64, from_b(0)),
            tcp(f.client, 40001, f.node, 30080, ACK, 64, IN),
            tcp(f.backends[0], 8080, f.snat, snat_port, ACK, 64, from_b(0)),
        ];
        let snap = old.export_flows();
        assert_eq!(snap.len(), 2);
        let want = run_frames(&mut old, &t_old, &later);
        assert!(want.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }), "{want:?}");

        let bytes = dataplane::process::snapshot::encode(&dataplane::process::snapshot::Snapshot {
            workers: vec![snap],
            affinity: vec![],
        });
        let got_snaps = dataplane::process::snapshot::decode(&bytes).unwrap().workers;
        let mut new = Pipeline::new(cfg.clone(), 12345);
        let rep = new.import_flows(&t_new, &got_snaps[0], 5_000);
        assert_eq!(rep.imported, 2, "{rep:?}");
        let got = run_frames(&mut new, &t_new, &later);
        for (i, ((gv, gf), (wv, wf))) in got.iter().zip(&want).enumerate() {
            assert_eq!(gv, wv, "packet {i}");
            assert_eq!(hex(gf), hex(wf), "packet {i}: the new pipeline rewrites as the old one did");
        }
        let k = new.counters();
        assert_eq!(k.events_of(Event::FlowImported), 2);
        assert_eq!(k.events_of(Event::NewFlow), 0, "no flow was made again");
        assert_eq!(k.events_of(Event::FlowPickedUp), 0);
        let flows = new.dump_flows();
        assert!(flows.iter().any(|x| x.snat_port == Some(snat_port)), "the SNAT port is kept: {flows:?}");
    }
}

/// Two flows that share a reply tuple (one client port to two frontends with one backend):
/// the newer took the reply entry while the older was not established, and the older was
/// established afterwards. A hand-over keeps the entry with its owner, whichever flow the
/// new process imports first.
#[test]
fn handed_over_flows_that_share_a_reply_tuple_keep_its_owner() {
    for f in [v4(), v6()] {
        let cfg = PipelineConfig { conntrack_capacity: 1024, snat_ports: (1024, 2047), ..PipelineConfig::default() };
        let (c, b0) = (f.client, f.backends[0]);
        let setup = two_frontends_one_backend(f);
        let t = TableBuilder::new().build(&setup).unwrap();
        let mut old = Pipeline::new(cfg.clone(), 7);
        old.begin_batch(&t, 1_000);
        let made = run_frames(
            &mut old,
            &t,
            &[
                tcp(c, 40000, f.vip, 80, SYN, 64, IN),
                tcp(c, 40000, f.lbip, 80, SYN, 64, IN),
                tcp(c, 40000, f.vip, 80, ACK, 64, IN),
            ],
        );
        assert!(made.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }), "{made:?}");
        let states: Vec<dataplane::conntrack::CtState> = old.dump_flows().iter().map(|x| x.state).collect();
        assert!(
            states.contains(&dataplane::conntrack::CtState::Established),
            "the older flow is established: {states:?}"
        );
        let reply = [tcp(b0, 8080, c, 40000, ACK, 64, from_b(0))];
        let want = run_frames(&mut old, &t, &reply);
        assert_eq!(hex(&want[0].1), hex(&tcp(f.lbip, 80, c, 40000, ACK, 63, OUT)), "the newer flow owns the replies");
        let snap = old.export_flows();
        assert_eq!(snap.len(), 2);
        let mut new = Pipeline::new(cfg.clone(), 12345);
        let rep = new.import_flows(&t, &snap, 5_000);
        assert_eq!(rep.imported, 2, "{rep:?}");
        let got = run_frames(&mut new, &t, &reply);
        assert_eq!(got, want, "the new process sends the replies as the old one did");
    }
}

/// A changed SNAT address or a backend that left keeps a flow out of the import; the others
/// come in.
#[test]
fn handed_over_flows_whose_backend_left_or_snat_address_changed_are_not_imported() {
    let f = v4();
    let cfg = PipelineConfig { conntrack_capacity: 1024, snat_ports: (1024, 2047), ..PipelineConfig::default() };
    let setup = spec(f, vec![]);
    let t_old = TableBuilder::new().build(&setup).unwrap();
    let mut old = Pipeline::new(cfg.clone(), 7);
    old.begin_batch(&t_old, 1_000);
    let syns = [tcp(f.client, 40000, f.vip, 80, SYN, 64, IN), tcp(f.client, 40001, f.node, 30080, SYN, 64, IN)];
    run_frames(&mut old, &t_old, &syns);
    let snap = old.export_flows();

    let mut moved = setup.clone();
    moved.snat_v4 = Some(IpAddr::from([10, 0, 0, 253]));
    let mut p = Pipeline::new(cfg.clone(), 1);
    let rep = p.import_flows(&TableBuilder::new().build(&moved).unwrap(), &snap, 2_000);
    assert_eq!((rep.imported, rep.snat_changed), (1, 1), "{rep:?}");

    let mut gone = setup.clone();
    let mut s = (*gone.services[0]).clone();
    s.backends = vec![local_backend(f.backends[1], 8080)];
    gone.services[0] = Arc::new(s);
    let mut p = Pipeline::new(cfg, 1);
    let rep = p.import_flows(&TableBuilder::new().build(&gone).unwrap(), &snap, 2_000);
    assert_eq!((rep.imported, rep.gone), (0, 2), "{rep:?}");
}

/// Pickup (issue 11): a TCP packet without SYN of a flow no pipeline knows (xlb restarted
/// without a hand-over) is tracked from there and counted `flow_picked_up`; with Maglev (`mh`)
/// and `sh` it reaches the backend its SYN reached in another process, for every client port.
#[test]
fn mid_stream_tcp_is_picked_up_on_the_same_backend_with_consistent_schedulers() {
    for sched in [Scheduler::Maglev { port: true }, Scheduler::Maglev { port: false }, Scheduler::SourceHash] {
        let f = v4();
        let mut svc = service(
            "default/web:http",
            vec![Frontend::new(f.vip, L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
            f.backends.iter().map(|b| local_backend(*b, 8080)).collect(),
            ForwardingMode::Nat,
        );
        svc.scheduler = sched;
        let setup = spec(f, vec![svc]);
        let cfg = PipelineConfig { conntrack_capacity: 1024, ..PipelineConfig::default() };
        let (t1, t2) = (TableBuilder::new().build(&setup).unwrap(), TableBuilder::new().build(&setup).unwrap());
        let mut spread = std::collections::BTreeSet::new();
        for cport in 40000..40032u16 {
            let mut before = Pipeline::new(cfg.clone(), 7);
            before.begin_batch(&t1, 1_000);
            let syn = run_frames(&mut before, &t1, &[tcp(f.client, cport, f.vip, 80, SYN, 64, IN)]);
            let mut after = Pipeline::new(cfg.clone(), 99);
            after.begin_batch(&t2, 1_000);
            let ack = run_frames(&mut after, &t2, &[tcp(f.client, cport, f.vip, 80, ACK, 64, IN)]);
            assert_eq!(ack[0].0, Verdict::Tx { port: 0 }, "{sched:?}");
            // Destination MAC and address: the backend.
            assert_eq!(ack[0].1[..6], syn[0].1[..6], "{sched:?} port {cport}: same next hop");
            assert_eq!(ack[0].1[30..34], syn[0].1[30..34], "{sched:?} port {cport}: same backend");
            spread.insert(syn[0].1[30..34].to_vec());
            assert_eq!(after.counters().events_of(Event::FlowPickedUp), 1);
            assert_eq!(before.counters().events_of(Event::FlowPickedUp), 0, "a SYN is not a pickup");
            assert_eq!(after.dump_flows().len(), 1, "the picked-up flow is tracked");
        }
        if sched == (Scheduler::Maglev { port: true }) {
            assert!(spread.len() > 1, "client ports spread over backends: {spread:?}");
        }
    }
}

/// The sweep of a batch's `begin_batch` does at most [`SWEEP_BUDGET`] records per family, and
/// the steps still expire every flow within a pass: 20,000 half-open flows (a step of 313
/// records, more than the budget) expire together, and no `begin_batch` removes more than
/// the budget of them.
#[test]
fn begin_batch_expires_a_wave_of_flows_at_most_the_sweep_budget_per_call() {
    let f = v4();
    let cfg = PipelineConfig { conntrack_capacity: 32_768, ..PipelineConfig::default() };
    let t = TableBuilder::new().build(&spec(f, vec![])).unwrap();
    let mut p = Pipeline::new(cfg, 7);
    p.begin_batch(&t, 1_000);
    let syns: Vec<Vec<u8>> = (0..20_000u16).map(|i| tcp(f.client, 10_000 + i, f.vip, 80, SYN, 64, IN)).collect();
    assert!(run_frames(&mut p, &t, &syns).iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }));
    assert_eq!(p.families().v4.ct.len(), 20_000);
    // SYN_SENT flows time out after 60 s: all of them have at 70 s.
    let expired = |p: &Pipeline| p.counters().events_of(Event::ConntrackExpired);
    let (mut calls, mut most) = (0, 0);
    for step in 0..dataplane::conntrack::SHARDS as u64 {
        let now = 70_000 + step * 100;
        loop {
            let before = expired(&p);
            p.begin_batch(&t, now);
            let n = expired(&p) - before;
            assert!(n <= u64::from(SWEEP_BUDGET), "one begin_batch expired {n} flows");
            most = most.max(n);
            calls += 1;
            if p.sweep_pending() == 0 {
                break;
            }
        }
    }
    assert_eq!(p.families().v4.ct.len(), 0, "a pass expired every flow");
    assert_eq!(expired(&p), 20_000);
    assert_eq!(most, u64::from(SWEEP_BUDGET), "the budget bounded some call");
    assert_eq!(calls, 128, "two calls per step of 313 records");
}

/// Errors xlb originates are rate-limited (RFC 4443 §2.4(f): MUST for ICMPv6; RFC 1812
/// §4.3.2.8 for ICMP): a flood of spoofed SYNs to a port without endpoints must not make xlb a
/// reflector of one error per packet. The budget is per worker and second, as Linux's
/// `icmp_msgs_per_sec`.
#[test]
fn generated_icmp_errors_are_limited_per_second() {
    for f in [v4(), v6()] {
        let tables = TableBuilder::new().build(&spec(f, vec![])).expect("tables");
        let mut p = Pipeline::new(PipelineConfig::default(), 7);
        let syn = tcp(f.client, 40000, f.vip, 81, SYN, 64, IN);
        let send = |p: &mut Pipeline| {
            let mut b = vec![0u8; BUF];
            b[..syn.len()].copy_from_slice(&syn);
            let mut pkt = Packet::new(&mut b, 0, syn.len());
            p.process(&tables, &mut pkt, 0)
        };
        p.begin_batch(&tables, 1_000);
        let verdicts: Vec<Verdict> = (0..1_500).map(|_| send(&mut p)).collect();
        let sent = verdicts.iter().filter(|v| **v == Verdict::Tx { port: 0 }).count();
        assert_eq!(sent, dataplane::process::ICMP_ERRORS_PER_S as usize, "errors sent in one second");
        assert!(verdicts[..sent].iter().all(|v| *v == Verdict::Tx { port: 0 }), "the budget comes first");
        assert!(
            verdicts[sent..].iter().all(|v| *v == Verdict::Drop(DropReason::IcmpRateLimited)),
            "after the budget: dropped, counted"
        );
        p.begin_batch(&tables, 2_000);
        assert_eq!(send(&mut p), Verdict::Tx { port: 0 }, "a second later the budget is back");
    }
}
