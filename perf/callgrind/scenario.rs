//! The pipeline benchmark scenario of issue 2, shared by the criterion bench
//! (`dataplane/benches/pipeline.rs`, which includes this file with `#[path]`) and the
//! callgrind driver (`perf/callgrind/pipeline.rs`), so both measure exactly the same tables
//! and flows.
//!
//! - [`SERVICES`] (1,000) ClusterIP services, one TCP frontend each (`10.96.x.y:80`),
//!   scheduler `mh` (Maglev with the source port), DNAT forwarding, no masquerade;
//! - [`BACKENDS_PER_SERVICE`] (10) backends each, 10,000 in total (`10.128.0.0/14`, port
//!   8080), every one with a resolved neighbour on port 0, so new and established packets
//!   reach [`Verdict::Tx`];
//! - [`FLOWS`] (1,000,000) client flows opened by one SYN each and moved to `ESTABLISHED` by
//!   one ACK each ([`populate`]), in a conntrack sized for [`CT_CAPACITY`] flows.
//!
//! Frames are kept as fixed 64-byte templates ([`Templates`]); each measured packet first
//! copies its template into the packet buffer ([`PacketBuf::run`]), because `process`
//! rewrites the frame in place.

use std::net::{IpAddr, Ipv4Addr};

use dataplane::build::Frame;
use dataplane::conntrack::Timeouts;
use dataplane::nat::Packet;
use dataplane::process::{Pipeline, PipelineConfig, Verdict};
use dataplane::tables::{
    BackendSpec, EmptyAction, ForwardingMode, Frontend, FrontendKind, L4Proto, NeighbourSpec, PortSpec, Scheduler,
    ServiceSpec, TableBuilder, Tables, TablesSpec,
};
use dataplane::wire::tcp_flags;

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
/// Packets per RX batch: [`Pipeline::begin_batch`] is called once per this many packets, as
/// an AF_XDP worker does.
pub(crate) const BATCH: usize = 64;
/// Bytes of a frame template slot (a TCP/IPv4 frame without payload is 54 bytes).
pub(crate) const SLOT: usize = 64;
/// Headroom before the frame in the packet buffer (room for an encapsulation header).
pub(crate) const HEADROOM: usize = 256;
/// Tailroom after the frame (room for generated replies).
pub(crate) const TAILROOM: usize = 256;
/// Frontend port of every service.
pub(crate) const VIP_PORT: u16 = 80;
/// Target port of every backend.
pub(crate) const BACKEND_PORT: u16 = 8080;

/// The VIP of service `svc`: `10.96.0.0/16` in order.
pub(crate) fn vip(svc: usize) -> [u8; 4] {
    let [_, _, hi, lo] = u32::try_from(svc).unwrap_or(u32::MAX).to_be_bytes();
    [10, 96, hi, lo]
}

/// The address of backend `i` (0..[`BACKENDS`]): `10.128.0.0/14` in order.
pub(crate) fn backend_addr(i: usize) -> [u8; 4] {
    let [_, b, c, d] = u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes();
    [10, 128 | (b & 3), c, d]
}

/// The table spec: [`SERVICES`] services × [`BACKENDS_PER_SERVICE`] backends, one port,
/// one neighbour per backend.
pub(crate) fn spec() -> TablesSpec {
    let services = (0..SERVICES)
        .map(|s| ServiceSpec {
            name: format!("bench/svc-{s}:http"),
            frontends: vec![Frontend::new(
                IpAddr::V4(Ipv4Addr::from(vip(s))),
                L4Proto::Tcp,
                VIP_PORT,
                FrontendKind::ClusterIp,
                false,
            )],
            scheduler: Scheduler::Maglev { port: true },
            affinity_timeout_s: None,
            mode: ForwardingMode::Nat,
            when_empty: EmptyAction::Reject,
            backends: (0..BACKENDS_PER_SERVICE)
                .map(|b| {
                    BackendSpec::ready(
                        IpAddr::V4(Ipv4Addr::from(backend_addr(s * BACKENDS_PER_SERVICE + b))),
                        BACKEND_PORT,
                    )
                })
                .collect(),
        })
        .map(std::sync::Arc::new)
        .collect();
    let neighbours = (0..BACKENDS)
        .map(|i| {
            let [_, b, c, d] = backend_addr(i);
            NeighbourSpec { addr: IpAddr::V4(Ipv4Addr::from(backend_addr(i))), mac: [0x02, 0xbe, 0, b, c, d], port: 0 }
        })
        .collect();
    TablesSpec {
        services,
        ports: vec![PortSpec { name: "eth0".into(), mac: [0x02, 0, 0, 0, 0, 0xfe], mtu: 1500 }],
        neighbours,
        routes: vec![],
        snat_v4: Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))),
        snat_v6: None,
        dsr_source_v4: None,
        dsr_source_v6: None,
        maglev_max_size: 0,
        cluster_cidrs: vec![],
    }
}

/// Builds the tables of [`spec`]; the builder is returned so that later builds reuse its
/// backend slots, as the control thread's does.
///
/// # Panics
/// If the spec does not build (a bug in this file).
pub(crate) fn tables() -> (TableBuilder, Tables) {
    let mut b = TableBuilder::new();
    let t = b.build(&spec()).unwrap_or_else(|e| panic!("bench spec does not build: {e}"));
    (b, t)
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
pub(crate) fn new_flow(i: usize) -> ([u8; 4], u16, usize) {
    let c = u32::try_from(i / 32).unwrap_or(u32::MAX);
    let [_, b, x, y] = c.to_be_bytes();
    let port = 40_000 + u16::try_from(i % 32).unwrap_or(0);
    ([198, 18 | (b & 1), x, y], port, (i * 7) % SERVICES)
}

/// A TCP/IPv4 frame from `(client, port)` to service `svc`'s VIP with `flags`.
pub(crate) fn tcp_frame((client, port, svc): ([u8; 4], u16, usize), flags: u8) -> Frame {
    Frame::tcp_v4(client, port, vip(svc), VIP_PORT, flags)
}

/// Frames in fixed [`SLOT`]-byte slots, one cache line each.
#[derive(Debug)]
pub(crate) struct Templates {
    slots: Vec<[u8; SLOT]>,
    len: usize,
}

impl Templates {
    /// `n` frames made by `make(i)`; all must have the same length, at most [`SLOT`] bytes.
    ///
    /// # Panics
    /// If a frame is longer than [`SLOT`] or the lengths differ.
    pub(crate) fn new(n: usize, make: impl Fn(usize) -> Frame) -> Self {
        let mut len = 0;
        let slots = (0..n)
            .map(|i| {
                let f = make(i);
                assert!(f.bytes.len() <= SLOT && (i == 0 || f.bytes.len() == len), "template {i}");
                len = f.bytes.len();
                let mut s = [0u8; SLOT];
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

    /// Template `i` (`i < count()`), padded to [`SLOT`] bytes.
    #[inline]
    pub(crate) fn slot(&self, i: usize) -> &[u8; SLOT] {
        &self.slots[i]
    }

    /// Frame length in bytes (without the slot padding).
    pub(crate) fn frame_len(&self) -> usize {
        self.len
    }
}

/// A packet buffer with headroom and tailroom, reused for every packet.
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
    /// Copies a template into the buffer (a fixed 64-byte copy): the harness part of every
    /// measured packet.
    #[inline]
    pub(crate) fn load(&mut self, tpl: &[u8; SLOT]) {
        self.buf[HEADROOM..HEADROOM + SLOT].copy_from_slice(tpl);
    }

    /// [`Self::load`] then [`Pipeline::process`] of the `len`-byte frame, arriving on port 0.
    #[inline]
    pub(crate) fn run(&mut self, p: &mut Pipeline, t: &Tables, tpl: &[u8; SLOT], len: usize) -> Verdict {
        self.load(tpl);
        let mut pkt = Packet::new(&mut self.buf, HEADROOM, len);
        p.process(t, &mut pkt, 0)
    }

    /// The buffer (to keep the copy alive under `black_box` in the copy-only baseline).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }
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

/// Runs every template through `p` once in batches of [`BATCH`] at [`NOW_MS`] and returns
/// the number of packets that were not [`Verdict::Tx`].
pub(crate) fn run_all(p: &mut Pipeline, t: &Tables, tpl: &Templates, buf: &mut PacketBuf) -> usize {
    let mut not_tx = 0;
    for i in 0..tpl.count() {
        if i.is_multiple_of(BATCH) {
            p.begin_batch(t, NOW_MS);
        }
        if !matches!(buf.run(p, t, tpl.slot(i), tpl.frame_len()), Verdict::Tx { .. }) {
            not_tx += 1;
        }
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
    let mut p = Pipeline::new(config(), seed);
    let mut buf = PacketBuf::default();
    let syns = syn_templates(acks.count());
    let not_tx = run_all(&mut p, t, &syns, &mut buf);
    assert_eq!(not_tx, 0, "SYNs of new flows must be forwarded");
    let not_tx = run_all(&mut p, t, acks, &mut buf);
    assert_eq!(not_tx, 0, "ACKs of established flows must be forwarded");
    assert_eq!(p.families().v4.ct.len(), acks.count(), "every flow is tracked");
    p
}

/// The tables, a populated worker and a packet buffer.
#[derive(Debug)]
pub(crate) struct World {
    /// The [`spec`] tables.
    pub(crate) tables: Tables,
    /// The worker, holding the established flows.
    pub(crate) pipeline: Pipeline,
    /// The packet buffer every measured packet goes through.
    pub(crate) buf: PacketBuf,
}

impl World {
    /// Builds the tables and a worker holding the flows of `acks` ([`populate`]).
    pub(crate) fn new(acks: &Templates) -> Self {
        let (_, tables) = tables();
        let pipeline = populate(&tables, acks, 0x5eed);
        Self { tables, pipeline, buf: PacketBuf::default() }
    }
}

/// Expires the new-flow entries a new-flow measurement added: moves the clock past the SYN
/// timeout (established flows stay) and sweeps every conntrack shard twice (a reverse entry
/// is dropped by the sweep of its own shard once its forward entry is gone). Returns the
/// new clock.
pub(crate) fn expire_new_flows(p: &mut Pipeline, t: &Tables, now_ms: u64) -> u64 {
    let syn_ms = u64::from(Timeouts::default().tcp_syn_s) * 1000;
    let mut now = now_ms + syn_ms + 2_000;
    let step = p.config().sweep_interval_ms.max(1);
    for _ in 0..2 * dataplane::conntrack::SHARDS {
        now += step;
        p.begin_batch(t, now);
    }
    now
}
