//! The pipeline benchmark scenario, shared by the criterion bench
//! (`dataplane/benches/pipeline.rs`, which includes this file with `#[path]`) and the
//! callgrind driver (`perf/callgrind/pipeline.rs`), so both measure exactly the same tables,
//! flows and packets.
//!
//! Worlds ([`Kind`]): [`SERVICES`] (1,000) services of [`BACKENDS_PER_SERVICE`] (10) backends,
//! 10,000 in total, scheduler `mh` (Maglev with the source port), one TCP frontend each
//! (`10.96.x.y:80`), every backend with a resolved neighbour:
//! - [`Kind::Dnat`]: ClusterIP, DNAT (kube-proxy's mode);
//! - [`Kind::Snat`]: the same frontends masqueraded (SNAT to `192.0.2.1`, as NodePorts are);
//! - [`Kind::Dsr`]: IPIP direct server return (outer sources from `172.16.0.0/16`);
//! - [`Kind::Dnat6`]: [`Kind::Dnat`] over IPv6 (`fd00:96::x:y` port 80, backends in
//!   `fd00:128::/64`, clients in `2001:db8:64::/64` and, for new flows, `2001:db8:198::/64`),
//!   its 74-byte frames in [`SLOT6`]-byte templates.
//!
//! Each world holds [`FLOWS`] (1,000,000) client flows, opened by one SYN each and moved to
//! `ESTABLISHED` by one ACK each ([`populate`]), in a conntrack sized for [`CT_CAPACITY`].
//!
//! Packets come in batches of [`BATCH`] (64) frames copied from fixed 64-byte templates
//! ([`Templates`]) into an [`Arena`] of [`BUFFERS`] (4,096) frame buffers of [`FRAME`] (2,048)
//! bytes, taken in turn like a UMEM's frames, at headroom 0 (encapsulation then moves the
//! packet into the tailroom; the AF_XDP workers leave the kernel's 256 bytes of headroom in
//! front of a frame, which the driver's `dsr_ipip_headroom` profile measures: [`Arena::new`]
//! takes the headroom); [`Pipeline::process_batch`] then runs on
//! the batch. Which flow each packet belongs to follows a [`Mix`]: uniform over the 1,000,000
//! flows, Zipf (s = 1) over them, or uniform over 1,024 hot flows. The old one-packet-at-a-time
//! loop ([`PacketBuf`], one buffer with 256 bytes of headroom, [`Pipeline::process`]) is kept
//! for the ratio.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane::addr::Cidr;
use dataplane::build::Frame;
use dataplane::conntrack::Timeouts;
use dataplane::nat::Packet;
use dataplane::process::{Pipeline, PipelineConfig, Verdict};
use dataplane::tables::{
    BackendSpec, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, NeighbourSpec, PortSpec, Scheduler,
    ServiceSpec, TableBuilder, Tables, TablesSpec,
};
use dataplane::wire::{proto, tcp_flags};

/// Number of services (one VIP:port frontend each).
pub(crate) const SERVICES: usize = 1_000;
/// Backends per service.
pub(crate) const BACKENDS_PER_SERVICE: usize = 10;
/// Backends in total.
pub(crate) const BACKENDS: usize = SERVICES * BACKENDS_PER_SERVICE;
/// Flows pre-inserted into conntrack by [`populate`].
pub(crate) const FLOWS: usize = 1_000_000;
/// Conntrack capacity per address family (flows); 20 % above [`FLOWS`] so new-flow packets
/// have room.
pub(crate) const CT_CAPACITY: usize = 1_200_000;
/// The worker clock during measurements, in milliseconds. It never advances inside a timed
/// loop, so no conntrack sweep runs there.
pub(crate) const NOW_MS: u64 = 1_000;
/// Packets per RX batch, as an AF_XDP worker takes them.
pub(crate) const BATCH: usize = 64;
/// Frame buffers the batches rotate over (as a UMEM's frames).
pub(crate) const BUFFERS: usize = 4_096;
/// Bytes of one frame buffer (the workers' UMEM frame size).
pub(crate) const FRAME: usize = 2_048;
/// Bytes of a frame template slot (a TCP/IPv4 frame without payload is 54 bytes).
pub(crate) const SLOT: usize = 64;
/// Bytes of an IPv6 world's template slot (a TCP/IPv6 frame without payload is 74 bytes).
pub(crate) const SLOT6: usize = 128;
/// Headroom before the frame in the one-packet loop's buffer.
pub(crate) const HEADROOM: usize = 256;
/// Tailroom after the frame in the one-packet loop's buffer.
pub(crate) const TAILROOM: usize = 256;
/// Frontend port of every service.
pub(crate) const VIP_PORT: u16 = 80;
/// Target port of every backend.
pub(crate) const BACKEND_PORT: u16 = 8080;
/// Hot flows of [`Mix::Hot`].
pub(crate) const HOT_FLOWS: usize = 1_024;
/// Length of a precomputed flow sequence (packets before it repeats).
pub(crate) const SEQUENCE: usize = 1 << 20;
/// The SNAT address of every world.
pub(crate) const SNAT: [u8; 4] = [192, 0, 2, 1];

/// What the services of a world do.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// DNAT (ClusterIP).
    Dnat,
    /// DNAT plus SNAT (masquerade).
    Snat,
    /// IPIP direct server return.
    Dsr,
    /// DNAT over IPv6.
    Dnat6,
}

/// Which flows the packets of a run belong to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mix {
    /// Each packet an independent uniform choice among the world's flows.
    Uniform,
    /// Zipf with exponent 1 over the world's flows (ranks scattered over the flows at random).
    Zipf,
    /// Uniform over [`HOT_FLOWS`] flows.
    Hot,
}

impl Mix {
    /// The name used in figure names: `uniform`, `zipf`, `hot`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Zipf => "zipf",
            Self::Hot => "hot",
        }
    }

    /// Parses [`Mix::name`].
    pub(crate) fn from_name(s: &str) -> Option<Self> {
        [Self::Uniform, Self::Zipf, Self::Hot].into_iter().find(|m| m.name() == s)
    }
}

/// The VIP of service `svc`: `10.96.0.0/16` in order.
pub(crate) fn vip(svc: usize) -> [u8; 4] {
    let [_, _, hi, lo] = u32::try_from(svc).unwrap_or(u32::MAX).to_be_bytes();
    [10, 96, hi, lo]
}

/// The IPv6 VIP of service `svc`: `fd00:96::x:y`, `x:y` the IPv4 VIP's last two octets.
pub(crate) fn vip6(svc: usize) -> [u8; 16] {
    let [_, _, hi, lo] = vip(svc);
    let mut a = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0).octets();
    (a[13], a[15]) = (hi, lo);
    a
}

/// The IPv6 address of backend `i`: `fd00:128::/64`, the IPv4 address's last three octets.
pub(crate) fn backend_addr6(i: usize) -> [u8; 16] {
    let [_, b, c, d] = backend_addr(i);
    let mut a = Ipv6Addr::new(0xfd00, 0x128, 0, 0, 0, 0, 0, 0).octets();
    (a[13], a[14], a[15]) = (b, c, d);
    a
}

/// The address of backend `i` (0..[`BACKENDS`]): `10.128.0.0/14` in order.
pub(crate) fn backend_addr(i: usize) -> [u8; 4] {
    let [_, b, c, d] = u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes();
    [10, 128 | (b & 3), c, d]
}

/// The services' scheduler: Maglev on the source address and port, or with `CG_SCHEDULER=random`
/// in the environment the weighted random choice that `make bench`'s configuration
/// (`perf/bench/bench.yaml`, kube-proxy's iptables and nftables behaviour) uses.
pub(crate) fn scheduler() -> Scheduler {
    match std::env::var("CG_SCHEDULER").as_deref() {
        Ok("random") => Scheduler::Random,
        _ => Scheduler::Maglev { port: true },
    }
}

/// The MTU of a second port, behind which the backends are, with `CG_BACKEND_MTU=N` in the
/// environment (the clients' port keeps 1,500): a node whose ports differ in MTU, whose flows
/// the pipeline checks for size (`flow_flags::MTU_CHECK`). `None`, one port, by default.
pub(crate) fn backend_mtu() -> Option<u16> {
    std::env::var("CG_BACKEND_MTU").ok().and_then(|s| s.parse().ok())
}

/// The table spec of a world: [`SERVICES`] services × [`BACKENDS_PER_SERVICE`] backends, one
/// port (two with [`backend_mtu`]), one neighbour per backend.
pub(crate) fn spec_of(kind: Kind) -> TablesSpec {
    let v6 = kind == Kind::Dnat6;
    let vip_of = |s| if v6 { IpAddr::V6(Ipv6Addr::from(vip6(s))) } else { IpAddr::V4(Ipv4Addr::from(vip(s))) };
    let backend_of =
        |i| if v6 { IpAddr::V6(Ipv6Addr::from(backend_addr6(i))) } else { IpAddr::V4(Ipv4Addr::from(backend_addr(i))) };
    let services = (0..SERVICES)
        .map(|s| ServiceSpec {
            name: format!("bench/svc-{s}:http"),
            frontends: vec![Frontend::new(
                vip_of(s),
                L4Proto::Tcp,
                VIP_PORT,
                FrontendKind::ClusterIp,
                kind == Kind::Snat,
            )],
            scheduler: scheduler(),
            affinity_timeout_s: None,
            mode: if kind == Kind::Dsr { ForwardingMode::DsrIpip } else { ForwardingMode::Nat },
            when_empty: EmptyAction::Reject,
            backends: (0..BACKENDS_PER_SERVICE)
                .map(|b| BackendSpec::ready(backend_of(s * BACKENDS_PER_SERVICE + b), BACKEND_PORT))
                .collect(),
        })
        .map(std::sync::Arc::new)
        .collect();
    let backend_mtu = backend_mtu();
    let neighbours = (0..BACKENDS)
        .map(|i| {
            let [_, b, c, d] = backend_addr(i);
            NeighbourSpec { addr: backend_of(i), mac: [0x02, 0xbe, 0, b, c, d], port: u8::from(backend_mtu.is_some()) }
        })
        .collect();
    let mut ports = vec![PortSpec { name: "eth0".into(), mac: [0x02, 0, 0, 0, 0, 0xfe], mtu: 1500 }];
    if let Some(mtu) = backend_mtu {
        ports.push(PortSpec { name: "eth1".into(), mac: [0x02, 0, 0, 0, 1, 0xfe], mtu });
    }
    TablesSpec {
        services,
        ports,
        neighbours,
        routes: vec![],
        kernel_routes: vec![],
        multipath_l4: false,
        snat_v4: Some(IpAddr::V4(Ipv4Addr::from(SNAT))),
        snat_v6: None,
        dsr_source_v4: (kind == Kind::Dsr).then_some(Cidr { addr: IpAddr::V4(Ipv4Addr::new(172, 16, 0, 0)), len: 16 }),
        dsr_source_v6: None,
        maglev_max_size: 0,
        maglev_min_size: 0,
        cluster_cidrs: vec![],
    }
}

/// The DNAT world's spec (the table benchmarks build it).
pub(crate) fn spec() -> TablesSpec {
    spec_of(Kind::Dnat)
}

/// Builds the tables of a world; the builder is returned so that later builds reuse its
/// backend slots, as the control thread's does.
///
/// # Panics
/// If the spec does not build (a bug in this file).
pub(crate) fn tables_of(kind: Kind) -> (TableBuilder, Tables) {
    let mut b = TableBuilder::new();
    let t = b.build(&spec_of(kind)).unwrap_or_else(|e| panic!("bench spec does not build: {e}"));
    (b, t)
}

/// [`tables_of`] the DNAT world.
pub(crate) fn tables() -> (TableBuilder, Tables) {
    tables_of(Kind::Dnat)
}

/// Worker configuration: conntrack for [`CT_CAPACITY`] flows, counters for every service and
/// backend, and an established timeout long enough that no measured flow expires however
/// long the bench runs (the SYN timeout stays at 60 s, so new-flow entries can be expired
/// between samples).
pub(crate) fn config() -> PipelineConfig {
    PipelineConfig {
        conntrack_capacity: CT_CAPACITY,
        timeouts: Timeouts { tcp_established_s: 1 << 30, ..Timeouts::default() },
        max_services: SERVICES,
        max_backends: BACKENDS,
        ..PipelineConfig::default()
    }
}

/// Client (address, port) and service of pre-inserted flow `i` (0..[`FLOWS`]): 62,500
/// clients in `100.64.0.0/10` with 16 ports each, services in turn.
pub(crate) fn flow(i: usize) -> ([u8; 4], u16, usize) {
    let c = u32::try_from(i / 16).unwrap_or(u32::MAX);
    let [_, b, x, y] = c.to_be_bytes();
    let port = 20_000 + u16::try_from(i % 16).unwrap_or(0) * 1_000;
    ([100, 64 | (b & 63), x, y], port, i % SERVICES)
}

/// Client (address, port) and service of new flow `i`: clients in `198.18.0.0/15`
/// (disjoint from [`flow`]'s), 32 ports each, so every `i` below 2^22 is a distinct flow.
/// The services take turns, or with `CG_ONE_SERVICE` set in the environment every new flow
/// goes to service 0, as `make bench`'s SYN flood goes to its one Service.
pub(crate) fn new_flow(i: usize) -> ([u8; 4], u16, usize) {
    static ONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let one = *ONE.get_or_init(|| std::env::var_os("CG_ONE_SERVICE").is_some());
    let c = u32::try_from(i / 32).unwrap_or(u32::MAX);
    let [_, b, x, y] = c.to_be_bytes();
    let port = 40_000 + u16::try_from(i % 32).unwrap_or(0);
    ([198, 18 | (b & 1), x, y], port, if one { 0 } else { (i * 7) % SERVICES })
}

/// A TCP/IPv4 frame from `(client, port)` to service `svc`'s VIP with `flags`.
pub(crate) fn tcp_frame((client, port, svc): ([u8; 4], u16, usize), flags: u8) -> Frame {
    Frame::tcp_v4(client, port, vip(svc), VIP_PORT, flags)
}

/// [`flow`] in the IPv6 world: the client `2001:db8:64::a:b:c`, `a.b.c` the IPv4 client's
/// last three octets.
pub(crate) fn flow6(i: usize) -> ([u8; 16], u16, usize) {
    let ([_, b, c, d], port, svc) = flow(i);
    let mut a = Ipv6Addr::new(0x2001, 0xdb8, 0x64, 0, 0, 0, 0, 0).octets();
    (a[13], a[14], a[15]) = (b, c, d);
    (a, port, svc)
}

/// [`new_flow`] in the IPv6 world: clients in `2001:db8:198::/64`.
pub(crate) fn new_flow6(i: usize) -> ([u8; 16], u16, usize) {
    let ([_, b, c, d], port, svc) = new_flow(i);
    let mut a = Ipv6Addr::new(0x2001, 0xdb8, 0x198, 0, 0, 0, 0, 0).octets();
    (a[13], a[14], a[15]) = (b, c, d);
    (a, port, svc)
}

/// A TCP/IPv6 frame from `(client, port)` to service `svc`'s IPv6 VIP with `flags`.
pub(crate) fn tcp_frame6((client, port, svc): ([u8; 16], u16, usize), flags: u8) -> Frame {
    Frame::tcp_v6(client, port, vip6(svc), VIP_PORT, flags)
}

/// Frames in fixed `N`-byte slots ([`SLOT`], one cache line each; [`SLOT6`] for IPv6).
#[derive(Debug)]
pub(crate) struct Templates<const N: usize = SLOT> {
    slots: Vec<[u8; N]>,
    len: usize,
}

impl<const N: usize> Templates<N> {
    /// `n` frames made by `make(i)`; all must have the same length, at most `N` bytes.
    ///
    /// # Panics
    /// If a frame is longer than `N` or the lengths differ.
    pub(crate) fn new(n: usize, make: impl Fn(usize) -> Frame) -> Self {
        let mut len = 0;
        let slots = (0..n)
            .map(|i| {
                let f = make(i);
                assert!(f.bytes.len() <= N && (i == 0 || f.bytes.len() == len), "template {i}");
                len = f.bytes.len();
                let mut s = [0u8; N];
                s[..len].copy_from_slice(&f.bytes);
                s
            })
            .collect();
        Self { slots, len }
    }

    /// Number of templates.
    pub(crate) fn count(&self) -> usize {
        self.slots.len()
    }

    /// Template `i` (`i < count()`), padded to `N` bytes.
    #[inline]
    pub(crate) fn slot(&self, i: usize) -> &[u8; N] {
        &self.slots[i]
    }

    /// Frame length in bytes (without the slot padding).
    pub(crate) fn frame_len(&self) -> usize {
        self.len
    }
}

/// A packet stream: frames in arrival order (templates picked by a sequence), so that copying
/// them into the RX buffers reads memory in order, as a NIC's DMA engine writes it, instead of
/// adding a random template read per packet to what is measured.
#[derive(Debug)]
pub(crate) struct Stream<const N: usize = SLOT> {
    frames: Vec<[u8; N]>,
    len: usize,
}

impl<const N: usize> Stream<N> {
    /// The frames `tpl.slot(seq[0]), tpl.slot(seq[1]), ...`.
    pub(crate) fn new(tpl: &Templates<N>, seq: &[u32]) -> Self {
        Self { frames: seq.iter().map(|&i| *tpl.slot(i as usize)).collect(), len: tpl.frame_len() }
    }

    /// Number of frames before the stream repeats.
    pub(crate) fn count(&self) -> usize {
        self.frames.len()
    }

    /// Frames `at..at + n` (at most to the end of the stream).
    #[inline]
    pub(crate) fn frames(&self, at: usize, n: usize) -> &[[u8; N]] {
        &self.frames[at..(at + n).min(self.frames.len())]
    }

    /// Frame length in bytes.
    pub(crate) fn frame_len(&self) -> usize {
        self.len
    }
}

/// A packet buffer with headroom and tailroom, reused for every packet (the one-packet loop).
#[derive(Debug)]
pub(crate) struct PacketBuf {
    buf: Vec<u8>,
}

impl Default for PacketBuf {
    fn default() -> Self {
        Self { buf: vec![0; HEADROOM + SLOT + TAILROOM] }
    }
}

impl PacketBuf {
    /// Copies a template into the buffer (a fixed `N`-byte copy, 64 for IPv4): the harness
    /// part of every measured packet.
    #[inline]
    pub(crate) fn load<const N: usize>(&mut self, tpl: &[u8; N]) {
        self.buf[HEADROOM..HEADROOM + N].copy_from_slice(tpl);
    }

    /// [`Self::load`] then [`Pipeline::process`] of the `len`-byte frame, arriving on port 0.
    #[inline]
    pub(crate) fn run<const N: usize>(&mut self, p: &mut Pipeline, t: &Tables, tpl: &[u8; N], len: usize) -> Verdict {
        self.load(tpl);
        let mut pkt = Packet::new(&mut self.buf, HEADROOM, len);
        p.process(t, &mut pkt, 0)
    }

    /// The buffer (to keep the copy alive under `black_box` in the copy-only baseline).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// [`BUFFERS`] frame buffers of [`FRAME`] bytes that batches take in turn, like a UMEM's frames.
#[derive(Debug)]
pub(crate) struct Arena {
    buf: Vec<u8>,
    next: usize,
    /// Headroom of every frame (0 in the workers).
    pub(crate) headroom: usize,
    verdicts: [Verdict; BATCH],
}

impl Arena {
    /// An arena whose frames start `headroom` bytes into their buffers.
    pub(crate) fn new(headroom: usize) -> Self {
        Self { buf: vec![0; BUFFERS * FRAME], next: 0, headroom, verdicts: [Verdict::Pass; BATCH] }
    }

    /// Copies `frames` (at most [`BATCH`], each `len` bytes) into the next buffers and, if `p` is
    /// given, runs them through [`Pipeline::process_batch`] on port 0. Returns how many verdicts
    /// were not [`Verdict::Tx`] (0 when only copying).
    #[inline]
    pub(crate) fn run<const N: usize>(
        &mut self,
        p: Option<(&mut Pipeline, &Tables)>,
        frames: &[[u8; N]],
        len: usize,
    ) -> usize {
        let n = frames.len().min(BATCH);
        let start = self.next * FRAME;
        self.next = (self.next + BATCH) % BUFFERS;
        let region = &mut self.buf[start..start + BATCH * FRAME];
        let mut chunks = region.chunks_exact_mut(FRAME);
        let h = self.headroom;
        let mut pkts: [Packet<'_>; BATCH] = core::array::from_fn(|_| match chunks.next() {
            Some(b) => Packet::new(b, h, len),
            None => Packet::new(&mut [], 0, 0),
        });
        for (pkt, f) in pkts.iter_mut().zip(frames) {
            pkt.buf[h..h + N].copy_from_slice(f);
        }
        let Some((p, t)) = p else {
            std::hint::black_box(&pkts);
            return 0;
        };
        p.process_batch(t, &mut pkts[..n], 0, &mut self.verdicts);
        self.verdicts[..n].iter().filter(|v| !matches!(v, Verdict::Tx { .. })).count()
    }

    /// The verdicts of the last batch.
    pub(crate) fn verdicts(&self) -> &[Verdict; BATCH] {
        &self.verdicts
    }
}

/// xorshift64* (Vigna 2016), deterministic sequences for the mixes.
#[derive(Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator from a non-zero seed.
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next value.
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value below `n` (n > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// [`SEQUENCE`] flow indices (below `flows`) following `mix`; a new-flow stream takes each
/// template once, in order, instead (see [`in_order`]).
pub(crate) fn sequence(mix: Mix, flows: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let idx = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
    match mix {
        Mix::Uniform => (0..SEQUENCE).map(|_| idx(rng.below(flows))).collect(),
        Mix::Hot => (0..SEQUENCE).map(|_| idx(rng.below(HOT_FLOWS.min(flows)))).collect(),
        Mix::Zipf => {
            // Inverse transform over the cumulative weights 1/k (s = 1), then a random
            // permutation so that the popular ranks are scattered over the flow table.
            let mut cdf = Vec::with_capacity(flows);
            let mut sum = 0.0f64;
            for k in 1..=flows {
                sum += 1.0 / k as f64;
                cdf.push(sum);
            }
            let mut perm: Vec<u32> = (0..flows).map(idx).collect();
            for i in (1..flows).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            (0..SEQUENCE)
                .map(|_| {
                    let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * sum;
                    let r = cdf.partition_point(|&c| c < u).min(flows - 1);
                    perm[r]
                })
                .collect()
        }
    }
}

/// The indices `0..n`: every template once, in order.
pub(crate) fn in_order(n: usize) -> Vec<u32> {
    (0..n).map(|i| u32::try_from(i).unwrap_or(u32::MAX)).collect()
}

/// SYN templates of pre-inserted flows `0..n` ([`flow`]).
pub(crate) fn syn_templates(n: usize) -> Templates {
    Templates::new(n, |i| tcp_frame(flow(i), tcp_flags::SYN))
}

/// ACK templates of pre-inserted flows `0..n` (an established flow's packet).
pub(crate) fn ack_templates(n: usize) -> Templates {
    Templates::new(n, |i| tcp_frame(flow(i), tcp_flags::ACK))
}

/// SYN templates of `n` flows that are not in conntrack ([`new_flow`] `0..n`).
pub(crate) fn new_syn_templates(n: usize) -> Templates {
    Templates::new(n, |i| tcp_frame(new_flow(i), tcp_flags::SYN))
}

/// Reply templates of the flows `0..n` of a SNAT world: an ACK from the flow's backend to the
/// SNAT address and port the flow got, read back from the worker's conntrack.
///
/// # Panics
/// If a flow of `0..n` is not tracked with a SNAT port.
pub(crate) fn snat_reply_templates(w: &World, n: usize) -> Templates {
    let mut by_client = std::collections::HashMap::with_capacity(n);
    for f in w.pipeline.dump_flows() {
        let IpAddr::V4(c) = f.client else { continue };
        let port = f.snat_port.expect("SNAT world flows have a SNAT port");
        let b = w.tables.backend(f.backend).expect("backend of a tracked flow");
        let IpAddr::V4(ba) = b.addr else { continue };
        by_client.insert((c.octets(), f.cport), (ba.octets(), port));
    }
    Templates::new(n, |i| {
        let (client, cport, _) = flow(i);
        let (baddr, port) = by_client[&(client, cport)];
        let seg = dataplane::build::tcp_segment(BACKEND_PORT, port, tcp_flags::ACK, 7000, 1001, &[]);
        Frame::ip(baddr.into(), SNAT.into(), proto::TCP, &seg, &dataplane::build::IpOpts::default())
    })
}

/// Runs every template through `p` once in batches of [`BATCH`] at [`NOW_MS`] and returns
/// the number of packets that were not [`Verdict::Tx`].
pub(crate) fn run_all<const N: usize>(p: &mut Pipeline, t: &Tables, tpl: &Templates<N>, arena: &mut Arena) -> usize {
    let mut not_tx = 0;
    for chunk in tpl.slots.chunks(BATCH) {
        p.begin_batch(t, NOW_MS);
        not_tx += arena.run(Some((&mut *p, t)), chunk, tpl.frame_len());
    }
    not_tx
}

/// A pipeline holding flows `0..acks.count()` ([`FLOWS`] in the benchmarks), each opened by
/// a SYN and established by its ACK from `acks` ([`ack_templates`]).
///
/// # Panics
/// If any of those packets is not forwarded ([`Verdict::Tx`]) or the conntrack does not
/// hold every flow afterwards: the benchmarks must measure the forwarding path, not a drop.
pub(crate) fn populate(t: &Tables, acks: &Templates, seed: u64) -> Pipeline {
    populate_with(t, &syn_templates(acks.count()), acks, seed)
}

/// [`populate`] with the SYNs `syns` of the flows of `acks` (of either family).
///
/// # Panics
/// As [`populate`].
pub(crate) fn populate_with<const N: usize>(
    t: &Tables,
    syns: &Templates<N>,
    acks: &Templates<N>,
    seed: u64,
) -> Pipeline {
    let mut p = Pipeline::new(config(), seed);
    let mut arena = Arena::new(0);
    let not_tx = run_all(&mut p, t, syns, &mut arena);
    assert_eq!(not_tx, 0, "SYNs of new flows must be forwarded");
    let not_tx = run_all(&mut p, t, acks, &mut arena);
    assert_eq!(not_tx, 0, "ACKs of established flows must be forwarded");
    let fam = p.families();
    assert_eq!(fam.v4.ct.len() + fam.v6.ct.len(), acks.count(), "every flow is tracked");
    p
}

/// SYN templates of the IPv6 world's pre-inserted flows `0..n` ([`flow6`]).
pub(crate) fn syn_templates6(n: usize) -> Templates<SLOT6> {
    Templates::new(n, |i| tcp_frame6(flow6(i), tcp_flags::SYN))
}

/// ACK templates of the IPv6 world's pre-inserted flows `0..n`.
pub(crate) fn ack_templates6(n: usize) -> Templates<SLOT6> {
    Templates::new(n, |i| tcp_frame6(flow6(i), tcp_flags::ACK))
}

/// SYN templates of `n` IPv6 flows that are not in conntrack ([`new_flow6`] `0..n`).
pub(crate) fn new_syn_templates6(n: usize) -> Templates<SLOT6> {
    Templates::new(n, |i| tcp_frame6(new_flow6(i), tcp_flags::SYN))
}

/// The tables, a populated worker and a packet buffer.
#[derive(Debug)]
pub(crate) struct World {
    /// What the services do.
    pub(crate) kind: Kind,
    /// The world's tables.
    pub(crate) tables: Tables,
    /// The worker, holding the established flows.
    pub(crate) pipeline: Pipeline,
    /// The one-packet loop's buffer.
    pub(crate) buf: PacketBuf,
}

impl World {
    /// Builds the tables of `kind` and a worker holding the flows of `acks` ([`populate`]).
    pub(crate) fn of(kind: Kind, acks: &Templates) -> Self {
        let (_, tables) = tables_of(kind);
        let pipeline = populate(&tables, acks, 0x5eed);
        Self { kind, tables, pipeline, buf: PacketBuf::default() }
    }

    /// [`World::of`] the DNAT world.
    pub(crate) fn new(acks: &Templates) -> Self {
        Self::of(Kind::Dnat, acks)
    }

    /// The IPv6 DNAT world ([`Kind::Dnat6`]) holding the flows of `acks` ([`ack_templates6`]).
    pub(crate) fn of6(acks: &Templates<SLOT6>) -> Self {
        let (_, tables) = tables_of(Kind::Dnat6);
        let pipeline = populate_with(&tables, &syn_templates6(acks.count()), acks, 0x5eed);
        Self { kind: Kind::Dnat6, tables, pipeline, buf: PacketBuf::default() }
    }
}

/// Expires the new-flow entries a new-flow measurement added: moves the clock past the SYN
/// timeout (established flows stay) and runs a whole pass of the conntrack sweep. Returns the
/// new clock.
pub(crate) fn expire_new_flows(p: &mut Pipeline, t: &Tables, now_ms: u64) -> u64 {
    let syn_ms = u64::from(Timeouts::default().tcp_syn_s) * 1000;
    let mut now = now_ms + syn_ms + 2_000;
    let step = p.config().sweep_interval_ms.max(1);
    for _ in 0..dataplane::conntrack::SHARDS {
        now += step;
        p.begin_batch(t, now);
        // The step is done SWEEP_BUDGET records per batch: finish it at the same time.
        while p.sweep_pending() > 0 {
            p.begin_batch(t, now);
        }
    }
    now
}
