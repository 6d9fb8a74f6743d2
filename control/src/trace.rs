//! `xlb trace`: frames of a capture through the real pipeline, offline.
//!
//! The frames go one by one through a [`Pipeline`] (the code the workers run, worker 0 of
//! one) over the tables `xlb check` builds from the same config, with conntrack carried from
//! frame to frame and the clock taken from the capture's timestamps. Each frame gets a
//! [`Traced`]: its 5-tuple, the frontend it matched, what conntrack did, the backend, the
//! action and the drop reason, and the frame as the pipeline left it. `xlb trace flow` asks
//! the same pipeline where one flow would go (Katran's `getRealForFlow`).
//!
//! Offline differences from `xlb run`, printed as notes: next hops the config does not name
//! (`xlb run` asks the kernel) get the placeholder MAC [`PLACEHOLDER_MAC`] so their flows are
//! forwarded rather than dropped as `no_neighbour`; every interface has the MAC given with
//! `--mac` (default 00:00:00:00:00:00).
//! Captures: pcap (microsecond or nanosecond) and pcapng (Enhanced and Simple Packet Blocks),
//! Ethernet link type only, read and written with the `pcap-file` crate.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use dataplane::addr::{Family, V4, V6};
use dataplane::conntrack::{CtFamily, Dir, FlowKey, flow_flags};
use dataplane::counters::{Event, WorkerCounters};
use dataplane::nat::Packet;
use dataplane::process::{FamState, Pipeline, Verdict};
use dataplane::tables::{NeighbourSpec, TableBuilder, Tables};
use dataplane::wire::{self, L3, proto};
use pcap_file::DataLink;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::{Block, PcapNgReader, PcapNgWriter};
use serde::Serialize;

/// MAC given to next hops the config does not resolve (a locally administered address).
pub(crate) const PLACEHOLDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

/// Bytes of headroom in front of each frame: room for an encapsulation (DSR IPIP/IP6IP6).
const HEADROOM: usize = 256;
/// Frame buffer size, as a worker's UMEM frame.
const BUF: usize = 4096;

/// What conntrack did with a frame.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Ct {
    /// The frame belongs to a flow tracked before it (either direction).
    Hit,
    /// The frame created a flow (`new_flow`; `flow_picked_up` for a TCP segment without SYN).
    New,
    /// A TCP, UDP or SCTP frame of no tracked flow that made none.
    Miss,
    /// Not looked up (not IP, not TCP/UDP/SCTP, or unparsable).
    None,
}

/// One frame's trace.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Traced {
    /// Frame number in the capture, from 1 (as Wireshark counts).
    pub frame: u64,
    /// Capture timestamp, seconds since the epoch.
    pub time_s: f64,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6`, the protocol number, or `arp`/`other`/`malformed`.
    pub proto: String,
    /// Source `address:port` (IPv6 in brackets); `None` when not IP.
    pub src: Option<SocketAddr>,
    /// Destination `address:port`.
    pub dst: Option<SocketAddr>,
    /// The frontend (Service table and kind) whose VIP:port is the destination, if any.
    pub frontend: Option<String>,
    /// Conntrack.
    pub conntrack: Ct,
    /// The flow's backend after the frame (`address:port`), when it has a flow.
    pub backend: Option<SocketAddr>,
    /// `dnat`, `snat`, `dsr`, `reply` (a backend's reply translated back), `reject`, `rst`,
    /// `icmp` (an ICMP error translated), `too_big`, `time_exceeded` (ICMP time exceeded sent
    /// back for a TTL that ran out), `tx` (other transmit), `pass`, `drop`, `handoff`.
    pub action: &'static str,
    /// The drop reason (`DropReason::name`) for `drop`.
    pub drop_reason: Option<&'static str>,
    /// Output port for a transmit.
    pub port: Option<u8>,
    /// Events the frame caused (`Event::name`), e.g. `new_flow`, `reject_sent`.
    pub events: Vec<&'static str>,
    /// The frame as the pipeline left it (the input for `pass` and `drop`).
    #[serde(skip)]
    pub out: Vec<u8>,
}

impl Traced {
    /// One line for people: `#N proto src -> dst frontend ct backend action`.
    pub(crate) fn line(&self) -> String {
        let mut s = format!("#{} {}", self.frame, self.proto);
        if let (Some(a), Some(b)) = (self.src, self.dst) {
            let _ = write!(s, " {a} -> {b}");
        }
        let _ = write!(s, " frontend={}", self.frontend.as_deref().unwrap_or("-"));
        let ct = match self.conntrack {
            Ct::Hit => "hit",
            Ct::New => "new",
            Ct::Miss => "miss",
            Ct::None => "-",
        };
        let _ = write!(s, " ct={ct}");
        if let Some(b) = self.backend {
            let _ = write!(s, " backend={b}");
        }
        let _ = write!(s, " {}", self.verdict());
        if !self.events.is_empty() {
            let _ = write!(s, " events={}", self.events.join(","));
        }
        s
    }

    /// The verdict as the output capture's packet comment: `dnat port 0`, `drop no_neighbour`...
    pub(crate) fn verdict(&self) -> String {
        match (self.drop_reason, self.port) {
            (Some(r), _) => format!("{} {r}", self.action),
            (None, Some(p)) => format!("{} port {p}", self.action),
            (None, None) => self.action.to_owned(),
        }
    }
}

/// The pipeline and tables a trace runs on.
pub(crate) struct Tracer {
    tables: Tables,
    pipe: Pipeline,
    frames: u64,
    buf: Vec<u8>,
}

impl Tracer {
    /// Loads `config` as `xlb check` does and builds the tables, every port with MAC `mac`
    /// (`xlb run` reads each interface's); `seed` seeds the pipeline's random choices. Returns
    /// the notes to print (object issues, placeholder next hops).
    ///
    /// # Errors
    /// The file cannot be loaded or translated, or the tables cannot be built.
    pub(crate) fn from_config(config: &Path, seed: u64, mac: [u8; 6]) -> anyhow::Result<(Self, Vec<String>)> {
        let loaded = crate::load_config(config)?;
        let mut notes: Vec<String> = loaded.notes.iter().map(|n| format!("note: {n}")).collect();
        let (mut spec, report) = xlb::translate::build_spec(&loaded.cluster, &loaded.config)?;
        for p in &mut spec.ports {
            p.mac = mac;
        }
        notes.extend(report.issues.iter().map(ToString::to_string));
        let first = TableBuilder::new()
            .build(&spec)
            .map_err(|e| anyhow::anyhow!("{}: the tables cannot be built: {e}", config.display()))?;
        let mut tables = first;
        if !tables.unresolved.is_empty() {
            let mut list: Vec<IpAddr> = tables.unresolved.iter().copied().collect();
            list.sort_unstable();
            let list: Vec<String> = list.iter().map(ToString::to_string).collect();
            notes.push(format!(
                "note: next hop(s) {} not in the config: traced with the placeholder MAC {} (xlb run asks the kernel)",
                list.join(", "),
                fmt_mac(PLACEHOLDER_MAC)
            ));
            let extra = tables.unresolved.iter().map(|&addr| NeighbourSpec { addr, mac: PLACEHOLDER_MAC, port: 0 });
            spec.neighbours.extend(extra);
            tables = TableBuilder::new()
                .build(&spec)
                .map_err(|e| anyhow::anyhow!("{}: the tables cannot be built: {e}", config.display()))?;
        }
        let mut cfg = xlb::orchestrate::pipeline_config(&loaded.config, 0, 1);
        cfg.max_services = tables.services.len().max(1);
        cfg.max_backends = tables.backends.len().max(1);
        let pipe = Pipeline::new(cfg, seed);
        Ok((Self { tables, pipe, frames: 0, buf: vec![0; BUF] }, notes))
    }

    /// Runs one captured frame (arrived on port 0 at `ts` since the epoch) through the
    /// pipeline. Frames longer than a UMEM frame allows are cut to it (and counted by the
    /// pipeline as whatever that makes them).
    pub(crate) fn frame(&mut self, data: &[u8], ts: Duration) -> Traced {
        self.frames += 1;
        let len = data.len().min(BUF - HEADROOM);
        let before = Snapshot::of(self.pipe.counters());
        let info = Info::of(data, Some(&self.tables));
        let tracked_before = info.key.as_ref().is_some_and(|k| self.flow_of(k).is_some());
        self.pipe.begin_batch(&self.tables, u64::try_from(ts.as_millis()).unwrap_or(u64::MAX));
        self.buf.fill(0);
        if let (Some(dst), Some(src)) = (self.buf.get_mut(HEADROOM..HEADROOM + len), data.get(..len)) {
            dst.copy_from_slice(src);
        }
        let mut pkt = Packet::new(&mut self.buf, HEADROOM, len);
        let v = self.pipe.process(&self.tables, &mut pkt, 0);
        let out = pkt.frame().to_vec();
        let after = Snapshot::of(self.pipe.counters());
        let events: Vec<&'static str> =
            Event::ALL.iter().filter(|e| after.event(**e) > before.event(**e)).map(|e| e.name()).collect();
        let created = events.contains(&Event::NewFlow.name()) || events.contains(&Event::FlowPickedUp.name());
        let flow = info.key.as_ref().and_then(|k| self.flow_of(k));
        let conntrack = match (&info.key, tracked_before, created) {
            (None, ..) => Ct::None,
            (Some(_), _, true) => Ct::New,
            (Some(_), true, false) => Ct::Hit,
            (Some(_), false, false) => Ct::Miss,
        };
        let (action, drop_reason, port) = match v {
            Verdict::Drop(r) => ("drop", Some(r.name()), None),
            Verdict::Pass => ("pass", None, None),
            Verdict::Handoff { .. } => ("handoff", None, None),
            Verdict::Tx { port } => {
                let has = |e: Event| events.contains(&e.name());
                let a = if has(Event::RejectSent) {
                    "reject"
                } else if has(Event::RstBackendGone) {
                    "rst"
                } else if has(Event::TooBigSent) {
                    "too_big"
                } else if has(Event::TimeExceededSent) {
                    "time_exceeded"
                } else if has(Event::IcmpTranslated) {
                    "icmp"
                } else {
                    match flow {
                        Some(f) if f.dir == Dir::Reply => "reply",
                        Some(f) if f.flags & flow_flags::DSR != 0 => "dsr",
                        Some(f) if f.flags & flow_flags::SNAT != 0 => "snat",
                        Some(_) => "dnat",
                        None => "tx",
                    }
                };
                (a, None, Some(port))
            }
        };
        Traced {
            frame: self.frames,
            time_s: ts.as_secs_f64(),
            proto: info.proto,
            src: info.src,
            dst: info.dst,
            frontend: info.frontend,
            conntrack,
            backend: flow.map(|f| f.backend),
            action,
            drop_reason,
            port,
            events,
            out: if matches!(v, Verdict::Tx { .. }) { out } else { data.to_vec() },
        }
    }

    /// The flow a key belongs to, in either direction.
    fn flow_of(&self, k: &Key) -> Option<Flow> {
        let fam = self.pipe.families();
        match k {
            Key::V4(k) => flow_in(&fam.v4, k),
            Key::V6(k) => flow_in(&fam.v6, k),
        }
    }
}

/// What the trace reads of a flow's record.
#[derive(Copy, Clone, Debug)]
struct Flow {
    dir: Dir,
    flags: u8,
    backend: SocketAddr,
}

fn flow_in<A: CtFamily>(st: &FamState<A>, k: &FlowKey<A>) -> Option<Flow> {
    let hit = st.ct.find(k, st.ct.hash(k))?;
    let r = st.ct.rec(hit.id)?;
    let (flags, addr, port) = (r.flags, r.backend_addr, r.bport);
    Some(Flow { dir: hit.dir, flags, backend: SocketAddr::new(addr.to_ip(), port) })
}

/// A frame's flow key, by family.
enum Key {
    V4(FlowKey<V4>),
    V6(FlowKey<V6>),
}

/// What the trace reads from the input frame itself.
struct Info {
    proto: String,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    frontend: Option<String>,
    key: Option<Key>,
}

impl Info {
    fn of(f: &[u8], t: Option<&Tables>) -> Self {
        let mut info = Self { proto: "malformed".into(), src: None, dst: None, frontend: None, key: None };
        let Ok((l3, at)) = wire::ethernet(f) else { return info };
        let parsed = match l3 {
            L3::V4 => wire::parse_v4(f, at),
            L3::V6 => wire::parse_v6(f, at),
            L3::Other => {
                info.proto = if wire::read_u16(f, at) == Some(0x0806) { "arp" } else { "other" }.into();
                return info;
            }
        };
        let Ok(p) = parsed else { return info };
        let (src, dst) = match l3 {
            L3::V4 => (addr::<V4>(f, p.l3 + 12), addr::<V4>(f, p.l3 + 16)),
            _ => (addr::<V6>(f, p.l3 + 8), addr::<V6>(f, p.l3 + 24)),
        };
        let (Some(src), Some(dst)) = (src, dst) else { return info };
        info.proto = match p.proto {
            proto::TCP => "tcp".into(),
            proto::UDP => "udp".into(),
            proto::SCTP => "sctp".into(),
            proto::ICMP => "icmp".into(),
            proto::ICMPV6 => "icmpv6".into(),
            n => n.to_string(),
        };
        info.src = Some(SocketAddr::new(src, p.sport));
        info.dst = Some(SocketAddr::new(dst, p.dport));
        let mapped = match dst {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        };
        info.frontend = t.and_then(|t| t.frontend(mapped, p.proto, p.dport).map(|fe| (t, fe))).and_then(|(t, fe)| {
            let s = t.services.get(usize::try_from(fe.service).ok()?)?;
            Some(format!("{} {}", s.name, fe.kind.name()))
        });
        if matches!(p.proto, proto::TCP | proto::UDP | proto::SCTP) && p.frag == wire::Frag::None {
            info.key = match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => Some(Key::V4(FlowKey {
                    src: V4(s.octets()),
                    dst: V4(d.octets()),
                    sport: p.sport,
                    dport: p.dport,
                    proto: p.proto,
                })),
                (IpAddr::V6(s), IpAddr::V6(d)) => Some(Key::V6(FlowKey {
                    src: V6(s.octets()),
                    dst: V6(d.octets()),
                    sport: p.sport,
                    dport: p.dport,
                    proto: p.proto,
                })),
                _ => None,
            };
        }
        info
    }
}

/// A frame's protocol name and source and destination `address:port` (as [`Traced`] shows
/// them; `None` for frames that are not IP), for `xlb monitor`.
pub(crate) fn describe(f: &[u8]) -> (String, Option<SocketAddr>, Option<SocketAddr>) {
    let i = Info::of(f, None);
    (i.proto, i.src, i.dst)
}

fn addr<A: Family>(f: &[u8], at: usize) -> Option<IpAddr> {
    A::from_slice(f.get(at..at + A::LEN)?).map(Family::to_ip)
}

/// Counter values a frame's trace compares before and after.
struct Snapshot {
    events: Vec<u64>,
}

impl Snapshot {
    fn of(c: &WorkerCounters) -> Self {
        Self { events: Event::ALL.iter().map(|e| c.events_of(*e)).collect() }
    }

    fn event(&self, e: Event) -> u64 {
        Event::ALL.iter().position(|x| *x == e).and_then(|i| self.events.get(i)).copied().unwrap_or(0)
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
///
/// # Errors
/// Not six colon-separated hex octets.
pub(crate) fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next().ok_or_else(|| format!("{s:?}: expected six octets like 02:00:00:00:00:fe"))?;
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?}: {p:?} is not a hex octet"))?;
    }
    if parts.next().is_some() {
        return Err(format!("{s:?}: more than six octets"));
    }
    Ok(mac)
}

fn fmt_mac(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// One captured frame.
pub(crate) struct Captured {
    /// Time since the epoch.
    pub ts: Duration,
    /// Link-layer bytes as captured.
    pub data: Vec<u8>,
}

/// Reads every frame of a pcap or pcapng file (told apart by the magic number).
///
/// # Errors
/// Unreadable file, a format error (with the frame number), or a link type other than
/// Ethernet (`LINKTYPE_ETHERNET`, 1).
pub(crate) fn read_capture(path: &Path) -> anyhow::Result<Vec<Captured>> {
    let mut file = BufReader::new(std::fs::File::open(path).with_context(|| format!("{}", path.display()))?);
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).with_context(|| format!("{}: too short for a capture", path.display()))?;
    let data = {
        let mut rest = magic.to_vec();
        file.read_to_end(&mut rest).with_context(|| format!("{}", path.display()))?;
        rest
    };
    let mut out = Vec::new();
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        let mut r =
            PcapNgReader::new(data.as_slice()).with_context(|| format!("{}: not a pcapng file", path.display()))?;
        // Per interface: link type and the factor that turns pcap-file's timestamp (read as
        // nanoseconds) into nanoseconds: the default resolution is microseconds (pcapng
        // if_tsresol absent = 6), which pcap-file 2.0 does not apply.
        let mut ifaces: Vec<(DataLink, u64)> = Vec::new();
        while let Some(b) = r.next_block() {
            let b = b.with_context(|| format!("{}: block after frame {}", path.display(), out.len()))?;
            match b {
                Block::SectionHeader(_) => ifaces.clear(),
                Block::InterfaceDescription(i) => {
                    let res = i.options.iter().find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                        _ => None,
                    });
                    let scale = match res.unwrap_or(6) {
                        r if r & 0x80 == 0 && r <= 9 => 10u64.pow(9 - u32::from(r)),
                        r => bail!(
                            "{}: interface {}: timestamp resolution {r:#x} not supported",
                            path.display(),
                            ifaces.len()
                        ),
                    };
                    ifaces.push((i.linktype, scale));
                }
                Block::EnhancedPacket(p) => {
                    let Some(&(link, scale)) = usize::try_from(p.interface_id).ok().and_then(|i| ifaces.get(i)) else {
                        bail!(
                            "{}: frame {} names interface {}, which is not described",
                            path.display(),
                            out.len() + 1,
                            p.interface_id
                        );
                    };
                    check_link(path, link)?;
                    let nanos = u64::try_from(p.timestamp.as_nanos()).unwrap_or(u64::MAX).saturating_mul(scale);
                    out.push(Captured { ts: Duration::from_nanos(nanos), data: p.data.into_owned() });
                }
                Block::SimplePacket(p) => {
                    let link = ifaces.first().map(|x| x.0).unwrap_or(DataLink::ETHERNET);
                    check_link(path, link)?;
                    out.push(Captured { ts: Duration::ZERO, data: p.data.into_owned() });
                }
                _ => {}
            }
        }
    } else {
        let mut r = pcap_file::pcap::PcapReader::new(data.as_slice())
            .with_context(|| format!("{}: neither pcap nor pcapng", path.display()))?;
        check_link(path, r.header().datalink)?;
        while let Some(p) = r.next_packet() {
            let p = p.with_context(|| format!("{}: frame {}", path.display(), out.len() + 1))?;
            out.push(Captured { ts: p.timestamp, data: p.data.into_owned() });
        }
    }
    Ok(out)
}

fn check_link(path: &Path, link: DataLink) -> anyhow::Result<()> {
    if link != DataLink::ETHERNET {
        bail!("{}: link type {link:?}: xlb trace reads Ethernet captures only (LINKTYPE_ETHERNET)", path.display());
    }
    Ok(())
}

/// Writes the traced frames as pcapng, one Ethernet interface with nanosecond timestamps,
/// each frame with its verdict as the packet comment (`opt_comment`).
///
/// # Errors
/// The file cannot be created or written.
pub(crate) fn write_capture(path: &Path, frames: &[(Duration, Traced)]) -> anyhow::Result<()> {
    let file = BufWriter::new(std::fs::File::create(path).with_context(|| format!("{}", path.display()))?);
    let mut w = PcapNgWriter::new(file).with_context(|| format!("{}", path.display()))?;
    w.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: 0,
        options: vec![InterfaceDescriptionOption::IfTsResol(9)],
    })
    .with_context(|| format!("{}", path.display()))?;
    for (ts, t) in frames {
        let comment = format!("xlb: {}", t.line());
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: *ts,
            original_len: u32::try_from(t.out.len()).unwrap_or(u32::MAX),
            data: Cow::Borrowed(&t.out),
            options: vec![EnhancedPacketOption::Comment(Cow::Owned(comment))],
        })
        .with_context(|| format!("{}", path.display()))?;
    }
    w.into_inner().flush().with_context(|| format!("{}", path.display()))?;
    Ok(())
}

/// `xlb trace --in`: every frame of `input` through the pipeline; one line (or JSON object)
/// per frame on stdout, the rewritten frames into `out`.
///
/// # Errors
/// As [`Tracer::from_config`], [`read_capture`] and [`write_capture`].
pub(crate) fn run_capture(
    config: &Path,
    input: &Path,
    out: Option<&Path>,
    json: bool,
    seed: u64,
    mac: [u8; 6],
) -> anyhow::Result<()> {
    let (mut tracer, notes) = Tracer::from_config(config, seed, mac)?;
    for n in &notes {
        eprintln!("{n}");
    }
    let frames = read_capture(input)?;
    let mut traced = Vec::with_capacity(if out.is_some() { frames.len() } else { 0 });
    let stdout = std::io::stdout();
    let mut o = BufWriter::new(stdout.lock());
    for c in &frames {
        let t = tracer.frame(&c.data, c.ts);
        if json {
            serde_json::to_writer(&mut o, &t)?;
            writeln!(o)?;
        } else {
            writeln!(o, "{}", t.line())?;
        }
        if out.is_some() {
            traced.push((c.ts, t));
        }
    }
    o.flush()?;
    if let Some(path) = out {
        write_capture(path, &traced)?;
    }
    Ok(())
}

/// `xlb trace flow`: which backend a new flow from `src` to `dst` (protocol `proto`) gets,
/// by sending its first packet (a TCP SYN, a UDP or SCTP datagram) through a fresh pipeline.
/// With `mh`/`sh` the answer is what every xlb with these tables answers; with the other
/// schedulers it is one draw (the note says so).
///
/// # Errors
/// As [`Tracer::from_config`]; addresses of two families; an unknown protocol.
pub(crate) fn run_flow(config: &Path, src: SocketAddr, dst: SocketAddr, proto: &str, json: bool) -> anyhow::Result<()> {
    let (mut tracer, notes) = Tracer::from_config(config, 1, [0; 6])?;
    for n in &notes {
        eprintln!("{n}");
    }
    let frame = first_packet(src, dst, proto)?;
    let t = tracer.frame(&frame, Duration::ZERO);
    if json {
        crate::print_out(&format!("{}\n", serde_json::to_string(&t)?));
    } else {
        crate::print_out(&format!("{}\n", t.line()));
    }
    let mapped = match dst.ip() {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    let p = proto_number(proto)?;
    if let Some(s) = tracer
        .tables
        .frontend(mapped, p, dst.port())
        .and_then(|fe| tracer.tables.services.get(usize::try_from(fe.service).ok()?))
        && !matches!(s.scheduler.name(), "mh" | "mh-noport" | "sh")
    {
        eprintln!(
            "note: {} uses `{}`, which does not pick from the flow alone: another xlb (or a later flow) may choose another backend",
            s.name,
            s.scheduler.name()
        );
    }
    Ok(())
}

fn proto_number(p: &str) -> anyhow::Result<u8> {
    match p.to_ascii_lowercase().as_str() {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        "sctp" => Ok(proto::SCTP),
        other => bail!("protocol {other:?}: expected tcp, udp or sctp"),
    }
}

/// The first packet of a flow: a TCP SYN, a UDP datagram or an SCTP packet, checksums filled
/// (`dataplane::build`, the builder of the fixtures).
fn first_packet(src: SocketAddr, dst: SocketAddr, p: &str) -> anyhow::Result<Vec<u8>> {
    use dataplane::build::{self, Frame, IpOpts};
    let n = proto_number(p)?;
    if src.is_ipv4() != dst.is_ipv4() {
        bail!("{src} and {dst} are of different address families");
    }
    let l4 = match n {
        proto::TCP => build::tcp_segment(src.port(), dst.port(), wire::tcp_flags::SYN, 1, 0, &[]),
        proto::UDP => build::udp_datagram(src.port(), dst.port(), b"xlb trace"),
        _ => build::sctp_packet(src.port(), dst.port(), 1, b"xlb trace"),
    };
    Ok(Frame::ip(src.ip(), dst.ip(), n, &l4, &IpOpts::default()).bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parses_six_hex_octets_and_nothing_else() {
        assert_eq!(parse_mac("02:00:00:00:00:fe"), Ok([2, 0, 0, 0, 0, 0xfe]));
        assert!(parse_mac("02:00:00:00:00").is_err());
        assert!(parse_mac("02:00:00:00:00:fe:01").is_err());
        assert!(parse_mac("02:00:00:00:00:zz").is_err());
    }

    /// A pcapng with one Ethernet interface (`tsresol`: its if_tsresol option, if any) and one
    /// frame whose raw timestamp is `raw` units.
    fn pcapng(tsresol: Option<u8>, raw: u64) -> Vec<u8> {
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        let options = tsresol.map(InterfaceDescriptionOption::IfTsResol).into_iter().collect();
        w.write_pcapng_block(InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options }).unwrap();
        // pcap-file 2.0 writes the Duration's nanoseconds as the raw count.
        let data = [0u8; 14];
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(raw),
            original_len: 14,
            data: Cow::Borrowed(&data),
            options: vec![],
        })
        .unwrap();
        w.into_inner()
    }

    #[test]
    fn pcapng_timestamps_follow_the_interface_resolution_microseconds_by_default() {
        let dir = std::env::temp_dir();
        for (res, raw, want) in
            [(None, 1_500_000, 1.5), (Some(6), 1_500_000, 1.5), (Some(9), 1_500_000_000, 1.5), (Some(3), 1_500, 1.5)]
        {
            let path = dir.join(format!("xlb-trace-unit-{}-{res:?}.pcapng", std::process::id()));
            std::fs::write(&path, pcapng(res, raw)).unwrap();
            let got = read_capture(&path);
            let _ = std::fs::remove_file(&path);
            let got = got.unwrap();
            assert_eq!(got.len(), 1);
            assert!((got[0].ts.as_secs_f64() - want).abs() < 1e-9, "if_tsresol {res:?}: {:?}", got[0].ts);
        }
    }
}
