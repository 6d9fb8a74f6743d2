//! What one xlb process hands the next (`xlb run --takeover`, docs/architecture.md
//! "Hand-over"): per worker, the conntrack records of both families and the SNAT port cursor,
//! exported when the worker has stopped and imported before the new worker forwards its
//! first frame; and the node's ClientIP affinity records ([`crate::affinity::AffinityRecord`]),
//! imported before the workers start. Fragment records are not carried: they live for
//! seconds and serve fragments that follow their first by microseconds, which the hand-over's
//! window (frames dropped from the old workers' stop to the new program's attach) loses
//! whether or not the record survives.
//!
//! The byte format ([`encode`], [`decode`]) is the records themselves
//! ([`crate::conntrack::FlowRecord`] is `Pod`, native byte order: both processes run on the
//! same machine) behind a header that names the format version ([`VERSION`]) and the record
//! sizes, followed by a CRC-32C of everything before it. A process accepts only its own
//! version: the version is raised whenever the record layout or the meaning of a field
//! changes, and a snapshot of another version is refused whole (the flows are then picked up
//! mid-stream, see [`crate::counters::Event::FlowPickedUp`]).
//!
//! What a record means outside its process is rewritten on the way: the expiry is stored as
//! the seconds the flow had left, and on import the backend slot and service id are found
//! again in the new tables by the flow's frontend (VIP, port, protocol) and the backend's
//! address and port ([`crate::tables::Tables::member_at`]); the precomputed next hop is marked
//! stale (generation 0), so the flow's first packet refreshes it from the new tables. A flow
//! whose frontend or backend the new tables lack, or whose SNAT address changed, is not
//! imported (counted in [`ImportReport`]).

use std::net::IpAddr;

use crate::addr::{V4, V6};
use crate::affinity::AffinityRecord;
use crate::conntrack::{CtFamily, Rec, flow_flags};
use crate::counters::Event;

use super::{Fam, FamState, Pipeline};
use crate::tables::Tables;

/// Format version of [`encode`] / [`decode`] (see the module docs for the rule). 2: the
/// affinity section. 3: a record's checksum deltas in wire order ([`crate::csum::wire`]).
pub const VERSION: u32 = 3;

/// First bytes of an encoded snapshot.
const MAGIC: [u8; 8] = *b"XLBFLOWS";

/// The flows of one worker.
#[derive(Clone, Debug, Default)]
pub struct FlowSnapshot {
    /// The worker the flows belong to ([`super::PipelineConfig::worker_id`]).
    pub worker_id: u16,
    /// Number of workers of the exporting process (SNAT port slices depend on it).
    pub workers: u16,
    /// The node's SNAT port range of the exporting process, inclusive.
    pub snat_ports: (u16, u16),
    /// The worker's next SNAT port.
    pub snat_cursor: u16,
    /// IPv4 flows, `expires_s` holding the seconds the flow had left (≥ 1).
    pub v4: Vec<Rec<V4>>,
    /// IPv6 flows, likewise.
    pub v6: Vec<Rec<V6>>,
}

impl FlowSnapshot {
    /// Flows of both families.
    #[must_use]
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Whether there is no flow.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything a process hands over: its workers' flows and the node's affinity records.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// One entry per worker.
    pub workers: Vec<FlowSnapshot>,
    /// ClientIP affinity records (shared by the workers).
    pub affinity: Vec<AffinityRecord>,
}

impl Snapshot {
    /// Flows of every worker.
    #[must_use]
    pub fn flows(&self) -> usize {
        self.workers.iter().map(FlowSnapshot::len).sum()
    }
}

/// What [`Pipeline::import_flows`] did with a snapshot's flows.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Flows now tracked by this pipeline: as many as its tables hold after the import.
    pub imported: usize,
    /// Flows whose frontend or backend the new tables do not have.
    pub gone: usize,
    /// SNAT flows not taken: the SNAT address, port range or worker count changed, so their
    /// replies would not reach this worker.
    pub snat_changed: usize,
    /// Flows the table had no room for (an import evicts no flow: with a smaller table than
    /// the old process's, the flows imported first stay), or already had.
    pub not_inserted: usize,
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    /// The bytes do not start with the snapshot magic.
    #[error("not an xlb flow snapshot (bad magic)")]
    Magic,
    /// Another format version ([`VERSION`]).
    #[error("flow snapshot version {found}, this xlb reads version {VERSION} only")]
    Version {
        /// The snapshot's version.
        found: u32,
    },
    /// The record sizes differ from this build's (a layout change without a version change).
    #[error("flow snapshot record sizes {found:?}, this xlb has {want:?}")]
    RecordSize {
        /// The snapshot's (IPv4, IPv6) record sizes in bytes.
        found: (u32, u32),
        /// This build's.
        want: (u32, u32),
    },
    /// Shorter than its header says.
    #[error("flow snapshot truncated at byte {0}")]
    Truncated(usize),
    /// The CRC-32C does not match.
    #[error("flow snapshot checksum mismatch")]
    Checksum,
    /// An affinity record's service name is not UTF-8 or its address family byte is not 4
    /// or 6.
    #[error("flow snapshot: affinity record at byte {0} is malformed")]
    Affinity(usize),
}

fn rec_sizes() -> (u32, u32) {
    let s = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    (s(size_of::<Rec<V4>>()), s(size_of::<Rec<V6>>()))
}

/// Encodes what a process hands over.
///
/// Layout (integers little-endian): magic (8 bytes), version (u32), IPv4 and IPv6 record sizes
/// (u32 each), worker count (u32); per worker: worker id, workers, SNAT low, SNAT high, SNAT
/// cursor (u16 each), 6 zero bytes, IPv4 and IPv6 flow counts (u64 each), the IPv4 records,
/// the IPv6 records; then the affinity record count (u64) and per record: service name length
/// (u16) and bytes (UTF-8), client (16 bytes, IPv4 mapped), backend family (1 byte: 4 or 6)
/// and address (16 bytes, IPv4 mapped), backend port (u16), seconds left (u32); then the
/// CRC-32C of all of the above (u32).
#[must_use]
pub fn encode(snap: &Snapshot) -> Vec<u8> {
    let snaps = &snap.workers;
    let (s4, s6) = rec_sizes();
    let body: usize = snaps.iter().map(|s| 32 + s.v4.len() * s4 as usize + s.v6.len() * s6 as usize).sum();
    let mut out = Vec::with_capacity(24 + body + 4);
    out.extend_from_slice(&MAGIC);
    for v in [VERSION, s4, s6, u32::try_from(snaps.len()).unwrap_or(u32::MAX)] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for s in snaps {
        for v in [s.worker_id, s.workers, s.snat_ports.0, s.snat_ports.1, s.snat_cursor] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(&(s.v4.len() as u64).to_le_bytes());
        out.extend_from_slice(&(s.v6.len() as u64).to_le_bytes());
        out.extend_from_slice(bytemuck::cast_slice(&s.v4));
        out.extend_from_slice(bytemuck::cast_slice(&s.v6));
    }
    out.extend_from_slice(&(snap.affinity.len() as u64).to_le_bytes());
    for a in &snap.affinity {
        let name = a.service.as_bytes();
        let name = name.get(..usize::from(u16::MAX)).unwrap_or(name);
        out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&a.client);
        let (fam, addr) = match a.backend {
            IpAddr::V4(x) => (4u8, x.to_ipv6_mapped().octets()),
            IpAddr::V6(x) => (6u8, x.octets()),
        };
        out.push(fam);
        out.extend_from_slice(&addr);
        out.extend_from_slice(&a.port.to_le_bytes());
        out.extend_from_slice(&a.left_s.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A cursor over the encoded bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).ok_or(SnapshotError::Truncated(self.at))?;
        let s = self.b.get(self.at..end).ok_or(SnapshotError::Truncated(self.at))?;
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        self.take(N)?.try_into().map_err(|_| SnapshotError::Truncated(self.at))
    }
    fn u16(&mut self) -> Result<u16, SnapshotError> {
        self.array().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.array().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.array().map(u64::from_le_bytes)
    }
    fn records<A: CtFamily>(&mut self, n: u64) -> Result<Vec<Rec<A>>, SnapshotError> {
        let size = size_of::<Rec<A>>();
        let len = usize::try_from(n).ok().and_then(|n| n.checked_mul(size)).ok_or(SnapshotError::Truncated(self.at))?;
        let bytes = self.take(len)?;
        // `FlowRecord` is `repr(C, packed)` (alignment 1), so any byte slice of the right
        // length is a slice of records.
        let recs: &[Rec<A>] = bytemuck::try_cast_slice(bytes).map_err(|_| SnapshotError::Truncated(self.at))?;
        Ok(recs.to_vec())
    }
}

/// Decodes what [`encode`] wrote.
///
/// # Errors
/// [`SnapshotError`]: not a snapshot, another version or record layout, truncated, a malformed
/// affinity record, or a checksum mismatch. Record contents are not trusted beyond that:
/// [`Pipeline::import_flows`] and [`crate::affinity::AffinityTable::import`] check what they
/// use.
pub fn decode(b: &[u8]) -> Result<Snapshot, SnapshotError> {
    let body_len = b.len().checked_sub(4).ok_or(SnapshotError::Truncated(b.len()))?;
    let mut r = Reader { b, at: 0 };
    if r.take(8)? != MAGIC {
        return Err(SnapshotError::Magic);
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(SnapshotError::Version { found: version });
    }
    let found = (r.u32()?, r.u32()?);
    if found != rec_sizes() {
        return Err(SnapshotError::RecordSize { found, want: rec_sizes() });
    }
    let (body, crc) = b.split_at(body_len);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(SnapshotError::Checksum);
    }
    let r = &mut Reader { b: body, at: r.at };
    let n = r.u32()?;
    let mut out = Vec::new();
    for _ in 0..n {
        let (worker_id, workers, lo, hi, snat_cursor) = (r.u16()?, r.u16()?, r.u16()?, r.u16()?, r.u16()?);
        r.take(6)?;
        let (n4, n6) = (r.u64()?, r.u64()?);
        let v4 = r.records::<V4>(n4)?;
        let v6 = r.records::<V6>(n6)?;
        out.push(FlowSnapshot { worker_id, workers, snat_ports: (lo, hi), snat_cursor, v4, v6 });
    }
    let n = r.u64()?;
    let mut affinity = Vec::new();
    for _ in 0..n {
        let at = r.at;
        let len = r.u16()?;
        let service = std::str::from_utf8(r.take(usize::from(len))?).map_err(|_| SnapshotError::Affinity(at))?.into();
        let client = r.array::<16>()?;
        let fam = r.array::<1>()?;
        let addr = std::net::Ipv6Addr::from(r.array::<16>()?);
        let backend = match fam {
            [4] => IpAddr::V4(addr.to_ipv4_mapped().ok_or(SnapshotError::Affinity(at))?),
            [6] => IpAddr::V6(addr),
            _ => return Err(SnapshotError::Affinity(at)),
        };
        let (port, left_s) = (r.u16()?, r.u32()?);
        affinity.push(AffinityRecord { service, client, backend, port, left_s });
    }
    if r.at != body.len() {
        return Err(SnapshotError::Truncated(r.at));
    }
    Ok(Snapshot { workers: out, affinity })
}

impl Pipeline {
    /// This worker's flows, for a hand-over (allocates; call when the worker has stopped).
    /// Expired flows are left out.
    #[must_use]
    pub fn export_flows(&self) -> FlowSnapshot {
        let now = self.c.now_s;
        FlowSnapshot {
            worker_id: self.c.cfg.worker_id,
            workers: self.c.cfg.workers,
            snat_ports: self.c.cfg.snat_ports,
            snat_cursor: self.c.snat_cursor,
            v4: export::<V4>(&self.fam.v4, now),
            v6: export::<V6>(&self.fam.v6, now),
        }
    }

    /// Takes over the flows of `s` (a worker of the previous process) under tables `t`, before
    /// this pipeline processes its first frame; `now_ms` is the clock [`Pipeline::begin_batch`]
    /// will be given. Each flow keeps its tuples, NAT rewrite, SNAT port, state and the time it
    /// had left; see the module docs for what is remapped and what is left out. Counted as
    /// `flow_imported`.
    pub fn import_flows(&mut self, t: &Tables, s: &FlowSnapshot, now_ms: u64) -> ImportReport {
        self.begin_batch(t, now_ms);
        let cfg = &self.c.cfg;
        let same_snat = s.workers == cfg.workers && s.snat_ports == cfg.snat_ports && s.worker_id == cfg.worker_id;
        if same_snat {
            self.c.snat_cursor = s.snat_cursor;
        }
        let mut rep = ImportReport::default();
        for r in &s.v4 {
            import::<V4>(&mut self.fam.v4, &mut self.c, t, *r, same_snat, &mut rep);
        }
        for r in &s.v6 {
            import::<V6>(&mut self.fam.v6, &mut self.c, t, *r, same_snat, &mut rep);
        }
        if let Some(c) = self.c.counters.events.get(Event::FlowImported as usize) {
            c.add(rep.imported as u64);
        }
        rep
    }
}

fn export<A: CtFamily>(st: &FamState<A>, now: u32) -> Vec<Rec<A>> {
    let mut out = Vec::with_capacity(st.ct.len());
    st.ct.for_each(|_, r| {
        if r.expires_s >= now {
            let mut x = *r;
            x.expires_s = r.expires_s - now + 1;
            x.flags &= !flow_flags::DEFERRED;
            out.push(x);
        }
    });
    out
}

fn import<A: Fam>(
    st: &mut FamState<A>,
    c: &mut super::Common,
    t: &Tables,
    mut r: Rec<A>,
    same_snat: bool,
    rep: &mut ImportReport,
) {
    if !r.in_use() || r.expires_s == 0 {
        return;
    }
    let Some(fe) = t.frontend(r.vip.to_mapped(), r.proto, r.vport) else {
        rep.gone += 1;
        return;
    };
    let (service, bport) = (fe.service, r.bport);
    let Some(b) = t.member_at(service, r.backend_addr.to_ip(), bport) else {
        rep.gone += 1;
        return;
    };
    let Some(svc) = t.services.get(service as usize) else {
        rep.gone += 1;
        return;
    };
    // A flow whose reply entry another flow took (`NO_REPLY`) stays without one: the entry's
    // owner is imported too, and gets it whatever the order.
    r.flags &= flow_flags::SNAT | flow_flags::DSR | flow_flags::ENCAP | flow_flags::NO_REPLY;
    if r.flags & flow_flags::SNAT != 0 && (!same_snat || A::snat(t) != Some(r.reply_dst)) {
        rep.snat_changed += 1;
        return;
    }
    let state = r.ct_state();
    r.state = state as u8;
    r.backend = b.this;
    r.svc = svc.id;
    r.generation = 0;
    r.expires_s = c.now_s.saturating_add(r.expires_s.saturating_sub(1));
    let key = r.fwd_key();
    // No room is made: in a full table `Conntrack::insert` would evict a not-established flow,
    // one imported before (a smaller conntrack capacity than the old process's). A flow that
    // finds the table full is not imported; with room, `insert` evicts nothing.
    let h = st.ct.hash(&key);
    if !st.ct.is_free(&key, h) || st.ct.len() >= st.ct.capacity() {
        rep.not_inserted += 1;
        return;
    }
    let now = c.now_s;
    if st.ct.insert(r, h, now, |x| c.on_removed(x)).is_err() {
        rep.not_inserted += 1;
        return;
    }
    c.sched.conns.add(b.this, state.is_active());
    rep.imported += 1;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::*;
    use crate::conntrack::CtState;

    fn rec4(client: [u8; 4], cport: u16) -> Rec<V4> {
        let mut r = Rec::<V4>::zeroed_record();
        (r.client, r.cport, r.vip, r.vport, r.proto, r.state, r.expires_s) =
            (V4(client), cport, V4([10, 96, 0, 1]), 80, 6, CtState::Established as u8, 30);
        r
    }

    /// One service: VIP 10.96.0.1:80/TCP to backend 10.0.0.1:8080, a neighbour on port 0, so
    /// the backend has a next hop.
    fn one_service_tables() -> Tables {
        use crate::tables::*;
        let spec = TablesSpec {
            services: vec![std::sync::Arc::new(ServiceSpec {
                name: "demo/web:http".into(),
                frontends: vec![Frontend::new(
                    IpAddr::from([10, 96, 0, 1]),
                    L4Proto::Tcp,
                    80,
                    FrontendKind::ClusterIp,
                    false,
                )],
                scheduler: Scheduler::Random,
                affinity_timeout_s: None,
                mode: ForwardingMode::Nat,
                when_empty: EmptyAction::Reject,
                backends: vec![BackendSpec::ready(IpAddr::from([10, 0, 0, 1]), 8080)],
            })],
            ports: vec![PortSpec { name: "eth0".into(), mac: [2, 0, 0, 0, 0, 1], mtu: 1500 }],
            neighbours: vec![NeighbourSpec { addr: IpAddr::from([10, 0, 0, 1]), mac: [2, 0, 0, 0, 0, 2], port: 0 }],
            ..Default::default()
        };
        TableBuilder::new().build(&spec).unwrap()
    }

    /// A DNAT flow from 10.0.0.100:`cport` to [`one_service_tables`]'s VIP and backend, in
    /// `state`, with 30 s left.
    fn dnat_flow(cport: u16, state: CtState) -> Rec<V4> {
        let mut r = rec4([10, 0, 0, 100], cport);
        (r.backend_addr, r.bport, r.reply_dst, r.reply_dport, r.state) =
            (V4([10, 0, 0, 1]), 8080, V4([10, 0, 0, 100]), cport, state as u8);
        r
    }

    fn sample() -> Snapshot {
        Snapshot { workers: sample_workers(), affinity: sample_affinity() }
    }

    fn sample_affinity() -> Vec<AffinityRecord> {
        vec![
            AffinityRecord {
                service: "demo/sticky:http".into(),
                client: [9; 16],
                backend: IpAddr::from([10, 250, 2, 11]),
                port: 80,
                left_s: 10_800,
            },
            AffinityRecord {
                service: "demo/web6:http".into(),
                client: [7; 16],
                backend: "fd00::11".parse().unwrap(),
                port: 8080,
                left_s: 1,
            },
        ]
    }

    fn sample_workers() -> Vec<FlowSnapshot> {
        vec![
            FlowSnapshot {
                worker_id: 0,
                workers: 2,
                snat_ports: (61000, 65535),
                snat_cursor: 61007,
                v4: vec![rec4([10, 0, 0, 1], 1000), rec4([10, 0, 0, 2], 2000)],
                v6: vec![],
            },
            FlowSnapshot {
                worker_id: 1,
                workers: 2,
                snat_ports: (61000, 65535),
                snat_cursor: 63300,
                ..Default::default()
            },
        ]
    }

    #[test]
    fn encoded_snapshot_decodes_to_the_same_flows() {
        let b = encode(&sample());
        let got = decode(&b).unwrap();
        let d = &got.workers;
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].worker_id, d[0].workers, d[0].snat_ports, d[0].snat_cursor), (0, 2, (61000, 65535), 61007));
        assert_eq!(d[0].v4.len(), 2);
        assert_eq!(bytemuck::cast_slice::<_, u8>(&d[0].v4), bytemuck::cast_slice::<_, u8>(&sample_workers()[0].v4));
        assert_eq!((d[1].worker_id, d[1].snat_cursor, d[1].len()), (1, 63300, 0));
        assert_eq!(got.affinity, sample_affinity());
    }

    #[test]
    fn snapshot_of_another_version_or_layout_is_refused() {
        let mut b = encode(&sample());
        b[8] = 1; // version 1, before the affinity section
        assert_eq!(decode(&b).unwrap_err(), SnapshotError::Version { found: 1 });
        let mut b = encode(&sample());
        b[12] = b[12].wrapping_add(1); // IPv4 record size
        assert!(matches!(decode(&b).unwrap_err(), SnapshotError::RecordSize { .. }));
        let mut b = encode(&sample());
        b[0] = b'Y';
        assert_eq!(decode(&b).unwrap_err(), SnapshotError::Magic);
    }

    #[test]
    fn affinity_record_with_an_unknown_address_family_is_refused() {
        let b = encode(&Snapshot { workers: vec![], affinity: sample_affinity()[..1].to_vec() });
        // Header 24 bytes, the worker count says 0, then the affinity count (8 bytes), name
        // length (2), name, client (16): the family byte.
        let fam_at = 24 + 8 + 2 + "demo/sticky:http".len() + 16;
        assert_eq!(b[fam_at], 4);
        let mut bad = b[..b.len() - 4].to_vec();
        bad[fam_at] = 5;
        let crc = crc32c::crc32c(&bad);
        bad.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&bad).unwrap_err(), SnapshotError::Affinity(24 + 8));
    }

    #[test]
    fn corrupt_or_truncated_snapshot_is_an_error_never_a_panic() {
        let b = encode(&sample());
        let mut flipped = b.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert_eq!(decode(&flipped).unwrap_err(), SnapshotError::Checksum);
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "a snapshot cut at {n} bytes must not decode");
        }
        // A count that claims more records than there are bytes (checksum made to match).
        let mut big = b[..b.len() - 4].to_vec();
        big[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&big);
        big.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&big).unwrap_err(), SnapshotError::Truncated(_)));
    }

    /// Importing into a table smaller than the snapshot (a lowered `conntrack.maxPerCore`)
    /// evicts no flow imported before: the report's `imported` is what the table holds, and
    /// the flows that found no room are `not_inserted`.
    #[test]
    fn import_report_counts_only_the_flows_the_table_keeps() {
        let t = one_service_tables();
        let snap = FlowSnapshot {
            workers: 1,
            snat_ports: (61000, 65535),
            v4: (0..64).map(|i| dnat_flow(40000 + i, CtState::FinWait)).collect(),
            ..Default::default()
        };
        let cfg = super::super::PipelineConfig { conntrack_capacity: 16, ..Default::default() };
        let mut p = Pipeline::new(cfg, 1);
        let rep = p.import_flows(&t, &snap, 5_000);
        let held = p.families().v4.ct.len();
        assert_eq!(
            rep.imported, held,
            "the report says {} flows were imported, the table holds {held}: {rep:?}",
            rep.imported
        );
        assert_eq!(rep.imported + rep.gone + rep.snat_changed + rep.not_inserted, snap.len(), "{rep:?}");
        assert_eq!(held, 16, "the table is full of imported flows: {rep:?}");
        assert_eq!(p.counters().events_of(Event::FlowImported), held as u64);
    }
}
