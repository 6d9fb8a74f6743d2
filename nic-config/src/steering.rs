//! The steering XDP program: load, attach, fill its maps, read its counters, detach.

use std::{
    fmt,
    net::IpAddr,
    os::fd::{AsFd as _, AsRawFd},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, XskMap},
    programs::{Xdp, XdpMode as AyaXdpMode},
};
use tracing::{info, warn};

use crate::{
    NicError, ServiceKey,
    filter::{ENDPOINT_ADDR_BITS, KeyFilter},
    index::{
        ENDPOINTS4_BITS, ENDPOINTS6_BITS, Form, SERVICES4_BITS, SERVICES6_BITS, SNAT4_BITS, SNAT6_BITS, SlotIndex,
        entry_of, fingerprint6, key_of, snat_entry, snat6_entries, snat6_id,
    },
    maps::{FamilyKey, Service4MapKey, ServiceMapKey, SnatRange, addr_bytes, addr_from_bytes, ipv4_of, stat},
};

/// The compiled `xdp/steer.c` (see `build.rs`), 8-byte aligned as aya requires.
static STEER_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"));

/// Name of the program function (`SEC("xdp") int xlb_steer(...)`); `bpftool prog show` lists it.
pub const PROGRAM_NAME: &str = "xlb_steer";

const MAP_XSKS: &str = "xsks";
const MAP_SERVICES4: &str = "services4";
const MAP_SERVICES4_INDEX: &str = "services4_index";
const MAP_ENDPOINTS4_INDEX: &str = "endpoints4_index";
const MAP_SNAT4_INDEX: &str = "snat4_index";
const MAP_SERVICES6_INDEX: &str = "services6_index";
const MAP_SNAT6_INDEX: &str = "snat6_index";
const MAP_ENDPOINTS6_INDEX: &str = "endpoints6_index";
const MAP_SERVICES: &str = "services";
const MAP_VIP_ADDRS: &str = "vip_addrs";
const MAP_SNAT4: &str = "snat4";
const MAP_SNAT_ADDRS: &str = "snat_addrs";
const MAP_ENDPOINTS4: &str = "endpoints4";
const MAP_ENDPOINTS: &str = "endpoints";
const MAP_STATS: &str = "stats";
const MAP_ENDPOINT_ADDR_FILTER: &str = "endpoint_addr_filter";
pub(crate) const MAP_L2_ADDRS: &str = "l2_addrs";
pub(crate) const MAP_L2_FILTER: &str = "l2_filter";
pub(crate) const MAP_L2_SELF: &str = "l2_self";

/// Capacity of the `xsks` map: the highest receive queue index a socket can serve, plus one.
pub const MAX_QUEUES: u32 = 256;
/// Capacity of the `services4` and `services` maps (entries of each family).
pub const MAX_SERVICES: usize = 65_536;
/// Largest number of NAT backends (address, protocol, port) of each family in the
/// `endpoints4` and `endpoints` maps (`max_entries` in xdp/steer.c).
pub const MAX_ENDPOINTS: usize = 262_144;
/// Capacity of the `vip_addrs` map (entries).
pub const MAX_VIP_ADDRS: usize = 16_384;
/// Capacity of the `snat4` and `snat_addrs` maps (addresses of each family).
pub const MAX_SNAT_ADDRS: usize = 1_024;
/// Capacity of the `l2_addrs` map (entries): the addresses one node answers ARP/NDP for.
pub const MAX_L2_ADDRS: usize = 16_384;

/// Where the kernel runs the XDP program.
///
/// See the kernel's XDP documentation,
/// <https://docs.kernel.org/networking/af_xdp.html#xdp-skb-mode-and-xdp-drv-mode> and
/// `ip-link(8)` (`xdpdrv`, `xdpgeneric`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XdpMode {
    /// Native (driver) mode, `XDP_FLAGS_DRV_MODE`: runs in the driver before an skb exists.
    /// veth supports it. [`Steering::attach`] falls back to [`XdpMode::Skb`] if the driver
    /// refuses, and logs a warning.
    Native,
    /// Generic mode, `XDP_FLAGS_SKB_MODE`: runs on the skb, works on every driver, slower.
    Skb,
}

impl fmt::Display for XdpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Skb => "skb",
        })
    }
}

impl From<XdpMode> for AyaXdpMode {
    fn from(m: XdpMode) -> Self {
        match m {
            XdpMode::Native => Self::Driver,
            XdpMode::Skb => Self::Skb,
        }
    }
}

/// Per-CPU counters of the steering program, summed over all CPUs. Units: frames, since the
/// program was loaded. Every frame the program sees increments exactly one of them, so the
/// frames handed to the kernel are `passed + parse_errors`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteeringStats {
    /// Frames for xlb given to `bpf_redirect_map` with a socket in the queue's `xsks` slot.
    /// A full RX ring can still drop them afterwards: see the socket's
    /// `XDP_STATISTICS` (`rx_dropped`, `rx_ring_full`).
    pub redirected: u64,
    /// Frames not for xlb, given to the kernel (`XDP_PASS`).
    pub passed: u64,
    /// Frames for xlb that arrived on a queue with no socket in `xsks`: dropped (`XDP_DROP`),
    /// so the kernel never forwards them untranslated (during a hand-over, or on a queue that
    /// no worker serves).
    pub redirect_failed: u64,
    /// Frames with truncated or malformed Ethernet/IP/L4 headers; given to the kernel.
    pub parse_errors: u64,
    /// ARP requests and Neighbor Solicitations for an address of `l2_addrs` (L2 announcement)
    /// answered by the program itself (`XDP_TX`); see [`crate::L2Responder`].
    pub l2_replied: u64,
    /// Frames to an address of `l2_addrs` that are not for one of its service ports, not an
    /// ICMP error and not a fragment: dropped (`XDP_DROP`), so the host's own sockets never
    /// answer on an announced VIP.
    pub l2_dropped: u64,
    /// With the destination MAC check on ([`crate::L2Responder::check_destination_mac`], L2
    /// mode): unicast frames addressed to another MAC than the interface's (flooded by a
    /// switch), given to the kernel (`XDP_PASS`), which drops them as another host's.
    pub l2_other_host: u64,
}

/// Our XDP steering program attached to one interface, with its maps.
///
/// Created by [`Steering::attach`]. The program is attached through netlink (`IFLA_XDP`, as
/// `ip link set dev IF xdp` does), not a BPF link: dropping this value or calling
/// [`Steering::detach`] detaches it (only if it is still the program attached) and closes the
/// map file descriptors, and the kernel frees program and maps. If the process dies instead,
/// the program stays attached with its maps: the kernel removes a closed AF_XDP socket from
/// the `xsks` map, so the program then drops the frames that are xlb's (no socket to take
/// them, counted `redirect_failed`) and passes the host's own traffic to the kernel, until a
/// new xlb replaces it ([`Steering::attach_replacing_leftover`]) or `ip link set dev IF xdp
/// off` removes it. Nothing is pinned to bpffs.
///
/// All methods act on the kernel objects through file descriptors, so they work from any
/// thread, whatever network namespace that thread is in; only `attach` resolves the interface
/// name in the calling thread's namespace.
pub struct Steering {
    // Field order matters for Drop: the typed maps close before the object that holds the
    // program and its link.
    xsks: XskMap<MapData>,
    services4: HashMap<MapData, [u8; Service4MapKey::LEN], u32>,
    services: HashMap<MapData, [u8; ServiceMapKey::LEN], u32>,
    vip_addrs: HashMap<MapData, [u8; 16], u32>,
    snat4: HashMap<MapData, [u8; 4], [u16; 2]>,
    snat_addrs: HashMap<MapData, [u8; 16], [u16; 2]>,
    endpoints4: HashMap<MapData, [u8; Service4MapKey::LEN], u32>,
    endpoints: HashMap<MapData, [u8; ServiceMapKey::LEN], u32>,
    stats: PerCpuArray<MapData, u64>,
    /// Written only through [`crate::L2Responder`] (opened again by id); kept for reading back.
    l2_addrs: HashMap<MapData, [u8; 16], [u8; 8]>,
    /// What the last sync wrote to each map, so the next one writes only the difference.
    shadow: Shadows,
    /// The slot indexes in front of `services4`, `endpoints4`, `snat4`, `services`,
    /// `endpoints` and `snat_addrs` (`index.rs`).
    services4_index: IndexMap,
    endpoints4_index: IndexMap,
    snat4_index: IndexMap,
    services6_index: IndexMap,
    endpoints6_index: IndexMap,
    snat6_index: IndexMap,
    /// `endpoint_addr_filter`: one bit per address of `endpoints4` and `endpoints` (`filter.rs`),
    /// which the program asks of a fragment's source, and whether the next write compares it
    /// with the kernel's words first.
    endpoint_addr_filter: (KeyFilter, Array<MapData, u64>),
    endpoint_addr_filter_verify: bool,
    /// Whether this value attached the program (and so detaches it).
    attached: bool,
    /// rtnetlink socket in the interface's network namespace (attach and detach work from
    /// any thread).
    nl: crate::nl::RouteSocket,
    ebpf: Ebpf,
    ifname: String,
    ifindex: u32,
    mode: XdpMode,
    prog_id: u32,
    map_ids: Vec<u32>,
}

/// The map contents as last written by xlb (only xlb writes these maps); `None` = not known,
/// so the next sync compares with the kernel's map itself.
#[derive(Default)]
struct Shadows {
    services4: Option<FastMap<[u8; Service4MapKey::LEN], u32>>,
    services: Option<FastMap<[u8; ServiceMapKey::LEN], u32>>,
    vip_addrs: Option<FastMap<[u8; 16], u32>>,
    snat4: Option<FastMap<[u8; 4], [u16; 2]>>,
    snat_addrs: Option<FastMap<[u8; 16], [u16; 2]>>,
    endpoints4: Option<FastMap<[u8; Service4MapKey::LEN], u32>>,
    endpoints: Option<FastMap<[u8; ServiceMapKey::LEN], u32>>,
}

/// Hash map with foldhash: the keys are our own table entries, and these maps hold up to
/// 262,144 of them per sync.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Slots of an index read back per verify sync: 1/8 of them, so the whole index is compared
/// with the kernel's every 8 `syncPeriod`s (`endpoints4_index`'s 524,288 slots are 65,536 map
/// lookups per period, `services4_index`'s 131,072 are 16,384).
const VERIFY_SHARES: usize = 8;

/// After a verify sync (`verify`), reads the next share of an array of `len` entries xlb alone
/// writes back with `reload(first entry, entries)`, which takes what the kernel holds and says
/// how many entries differed from what xlb wrote (the next update rewrites them), and logs
/// those that did: one share per `syncPeriod`, from `verify_at` on, around the end.
fn read_back_share(
    ifname: &str,
    map: &str,
    what: &str,
    verify: &mut bool,
    verify_at: &mut usize,
    len: usize,
    reload: impl FnOnce(usize, usize) -> usize,
) {
    if !std::mem::take(verify) {
        return;
    }
    let n = len / VERIFY_SHARES;
    let differed = reload(*verify_at, n);
    *verify_at = (*verify_at + n) % len;
    if differed > 0 {
        warn!(ifname, map, entries = differed, "{what} differed from what xlb wrote; repairing");
    }
}

/// A slot index (`index.rs`) and its `ARRAY` map.
struct IndexMap {
    name: &'static str,
    map: Array<MapData, u64>,
    /// What the map holds (only xlb writes it; a new program's array is all empty).
    index: SlotIndex,
    /// Read a share of the slots back before the next update ([`Steering::verify_next_sync`]).
    verify: bool,
    /// The first slot of the next share read back.
    verify_at: usize,
}

impl IndexMap {
    fn new(name: &'static str, map: Array<MapData, u64>, bits: u32, form: Form) -> Self {
        Self { name, map, index: SlotIndex::new(bits, form), verify: false, verify_at: 0 }
    }

    /// The `services4` / `endpoints4` keys left to the hash map, sorted.
    fn overflow(&self) -> Vec<ServiceKey> {
        let mut v: Vec<ServiceKey> =
            self.index.overflow_entries().map(|e| Service4MapKey::from_bytes(&key_of(e)).to_service_key()).collect();
        v.sort();
        v
    }

    /// Brings the index to the slot values `entries`, made from its hash map's contents as
    /// last written (`None` while they are not known: the next sync knows them); after a
    /// verify sync, first reads the next share of its slots back and repairs what differs.
    fn sync(&mut self, ifname: &str, entries: Option<impl IntoIterator<Item = u64>>) -> Result<(), NicError> {
        let Some(entries) = entries else { return Ok(()) };
        let (map, index) = (&self.map, &mut self.index);
        read_back_share(
            ifname,
            self.name,
            "slot index",
            &mut self.verify,
            &mut self.verify_at,
            index.len(),
            |at, n| index.reload(at, n, |i| map.get(&i, 0).ok()),
        );
        let (name, map) = (self.name, &mut self.map);
        self.index.apply(entries, |i, v| map.set(i, v, 0)).map_err(|e| NicError::map(ifname, name, "update", e))
    }
}

/// The slot values (fingerprints) of the keys of `services` or `endpoints` as last written.
fn key20_entries(keys: Option<&FastMap<[u8; ServiceMapKey::LEN], u32>>) -> Option<impl Iterator<Item = u64> + '_> {
    keys.map(|m| m.keys().map(fingerprint6))
}

/// The keys of `keys` (`services` or `endpoints` as last written) whose fingerprints `index`
/// leaves to the hash map, sorted.
fn overflow6(index: &IndexMap, keys: Option<&FastMap<[u8; ServiceMapKey::LEN], u32>>) -> Vec<ServiceKey> {
    let left: std::collections::HashSet<u64> = index.index.overflow_entries().collect();
    let mut v: Vec<ServiceKey> = keys
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| left.contains(&fingerprint6(k)))
        .map(|k| ServiceMapKey::from_bytes(k).to_service_key())
        .collect();
    v.sort();
    v
}

/// The slot values of `snat6_index` for `snat_addrs` as last written ([`snat6_entries`]).
fn snat6_slots(ranges: Option<&FastMap<[u8; 16], [u16; 2]>>) -> Option<Vec<u64>> {
    ranges.map(|m| snat6_entries(m.iter()))
}

/// The slot values of the keys of `services4` or `endpoints4` as last written.
fn key8_entries(keys: Option<&FastMap<[u8; Service4MapKey::LEN], u32>>) -> Option<impl Iterator<Item = u64> + '_> {
    keys.map(|m| m.keys().map(|k| entry_of(*k)))
}

/// The slot values of `snat4` as last written.
fn snat4_entries(ranges: Option<&FastMap<[u8; 4], [u16; 2]>>) -> Option<impl Iterator<Item = u64> + '_> {
    ranges.map(|m| m.iter().map(|(a, [first, last])| snat_entry(*a, *first, *last)))
}

/// The wanted entries (value 0) of `services4` and `services` (or `endpoints4` and
/// `endpoints`), validated: the IPv4 keys, then the IPv6 ones.
type KeyMaps = (FastMap<[u8; Service4MapKey::LEN], u32>, FastMap<[u8; ServiceMapKey::LEN], u32>);

fn key_maps(keys: &[ServiceKey]) -> Result<KeyMaps, NicError> {
    let (mut v4, mut v6) = (FastMap::default(), FastMap::default());
    for k in keys {
        match FamilyKey::try_from(k)? {
            FamilyKey::V4(b) => v4.insert(b, 0),
            FamilyKey::V6(b) => v6.insert(b, 0),
        };
    }
    Ok((v4, v6))
}

impl fmt::Debug for Steering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steering")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("mode", &self.mode)
            .field("prog_id", &self.prog_id)
            .field("map_ids", &self.map_ids)
            .field("attached", &self.attached)
            .finish_non_exhaustive()
    }
}

/// Takes map `name` out of `ebpf` as the typed map `T`, recording its kernel id in `ids`.
fn open_map<T>(ebpf: &mut Ebpf, ifname: &str, name: &'static str, ids: &mut Vec<u32>) -> Result<T, NicError>
where
    T: TryFrom<Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(NicError::MissingObject { kind: "map", name })?;
    let (Map::HashMap(data) | Map::XskMap(data) | Map::PerCpuArray(data) | Map::Array(data)) = &map else {
        return Err(NicError::MissingObject { kind: "map (of the expected type)", name });
    };
    let id = data.info().map_err(|e| NicError::map(ifname, name, "BPF_OBJ_GET_INFO_BY_FD", e))?.id();
    ids.push(id);
    T::try_from(map).map_err(|e| NicError::map(ifname, name, "open", e))
}

impl Steering {
    /// Loads the steering program and attaches it to `ifname` (in the calling thread's network
    /// namespace).
    ///
    /// With [`XdpMode::Native`], a driver that refuses native mode makes this retry in
    /// [`XdpMode::Skb`] and log a warning; [`Steering::mode`] tells which mode was used.
    /// All maps start empty: until [`Steering::set_xsk`] and the `sync_*` methods are called,
    /// every frame passes to the kernel.
    ///
    /// Needs root (CAP_BPF + CAP_NET_ADMIN). Replaces no program: if another XDP program is
    /// attached to the interface (e.g. libxdp's default program, or a second `Steering`),
    /// attaching fails with `EBUSY` and no fallback is tried (our program is then unloaded).
    ///
    /// # Errors
    /// [`NicError::Load`] if the object cannot be loaded, [`NicError::UnknownInterface`],
    /// [`NicError::Program`] if verification or attaching fails.
    pub fn attach(ifname: &str, mode: XdpMode) -> Result<Self, NicError> {
        let mut st = Self::load(ifname, mode)?;
        st.attach_loaded()?;
        Ok(st)
    }

    /// Loads the steering program for `ifname` and opens its maps without attaching it, so
    /// that the maps (sockets included) can be filled first; then [`Steering::attach_loaded`]
    /// attaches it.
    ///
    /// # Errors
    /// As [`Steering::attach`].
    pub fn load(ifname: &str, mode: XdpMode) -> Result<Self, NicError> {
        let mut ebpf = EbpfLoader::new().load(STEER_OBJ).map_err(NicError::load)?;
        let prog_err = |mode, e| NicError::program(ifname, mode, e);
        let program: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(NicError::MissingObject { kind: "program", name: PROGRAM_NAME })?
            .try_into()
            .map_err(|e| prog_err(mode, e))?;
        program.load().map_err(|e| prog_err(mode, e))?;
        let prog_id = program.info().map_err(|e| prog_err(mode, e))?.id();
        let ifindex = crate::iface::ifindex(ifname)?;
        let mut map_ids = Vec::with_capacity(19);
        let xsks = open_map(&mut ebpf, ifname, MAP_XSKS, &mut map_ids)?;
        let services4 = open_map(&mut ebpf, ifname, MAP_SERVICES4, &mut map_ids)?;
        let services4_index = IndexMap::new(
            MAP_SERVICES4_INDEX,
            open_map(&mut ebpf, ifname, MAP_SERVICES4_INDEX, &mut map_ids)?,
            SERVICES4_BITS,
            Form::Key8,
        );
        let services = open_map(&mut ebpf, ifname, MAP_SERVICES, &mut map_ids)?;
        let vip_addrs = open_map(&mut ebpf, ifname, MAP_VIP_ADDRS, &mut map_ids)?;
        let snat4 = open_map(&mut ebpf, ifname, MAP_SNAT4, &mut map_ids)?;
        let snat4_index = IndexMap::new(
            MAP_SNAT4_INDEX,
            open_map(&mut ebpf, ifname, MAP_SNAT4_INDEX, &mut map_ids)?,
            SNAT4_BITS,
            Form::Snat4,
        );
        let snat_addrs = open_map(&mut ebpf, ifname, MAP_SNAT_ADDRS, &mut map_ids)?;
        let endpoints4 = open_map(&mut ebpf, ifname, MAP_ENDPOINTS4, &mut map_ids)?;
        let endpoints4_index = IndexMap::new(
            MAP_ENDPOINTS4_INDEX,
            open_map(&mut ebpf, ifname, MAP_ENDPOINTS4_INDEX, &mut map_ids)?,
            ENDPOINTS4_BITS,
            Form::Key8,
        );
        let endpoints = open_map(&mut ebpf, ifname, MAP_ENDPOINTS, &mut map_ids)?;
        let services6_index = IndexMap::new(
            MAP_SERVICES6_INDEX,
            open_map(&mut ebpf, ifname, MAP_SERVICES6_INDEX, &mut map_ids)?,
            SERVICES6_BITS,
            Form::Key8,
        );
        let snat6_index = IndexMap::new(
            MAP_SNAT6_INDEX,
            open_map(&mut ebpf, ifname, MAP_SNAT6_INDEX, &mut map_ids)?,
            SNAT6_BITS,
            Form::Snat4,
        );
        let endpoints6_index = IndexMap::new(
            MAP_ENDPOINTS6_INDEX,
            open_map(&mut ebpf, ifname, MAP_ENDPOINTS6_INDEX, &mut map_ids)?,
            ENDPOINTS6_BITS,
            Form::Key8,
        );
        let endpoint_addr_filter =
            (KeyFilter::new(ENDPOINT_ADDR_BITS), open_map(&mut ebpf, ifname, MAP_ENDPOINT_ADDR_FILTER, &mut map_ids)?);
        let stats = open_map(&mut ebpf, ifname, MAP_STATS, &mut map_ids)?;
        // Opened again by id by `l2_responder`; kept here so the id is recorded.
        let _: Array<MapData, u64> = open_map(&mut ebpf, ifname, MAP_L2_FILTER, &mut map_ids)?;
        let l2_addrs = open_map(&mut ebpf, ifname, MAP_L2_ADDRS, &mut map_ids)?;
        // Opened again by id by `l2_responder`; kept here so the id is recorded.
        let _: aya::maps::Array<MapData, [u8; 8]> = open_map(&mut ebpf, ifname, MAP_L2_SELF, &mut map_ids)?;
        Ok(Self {
            xsks,
            services4,
            services,
            vip_addrs,
            snat4,
            snat_addrs,
            endpoints4,
            endpoints,
            stats,
            l2_addrs,
            shadow: Shadows::default(),
            services4_index,
            endpoints4_index,
            snat4_index,
            services6_index,
            endpoints6_index,
            snat6_index,
            endpoint_addr_filter,
            endpoint_addr_filter_verify: false,
            attached: false,
            nl: crate::nl::RouteSocket::new("RTM_SETLINK IFLA_XDP")?,
            ebpf,
            ifname: ifname.to_owned(),
            ifindex,
            mode,
            prog_id,
            map_ids,
        })
    }

    fn program(&mut self) -> Result<&mut Xdp, NicError> {
        let (ifname, mode) = (self.ifname.clone(), self.mode);
        self.ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(NicError::MissingObject { kind: "program", name: PROGRAM_NAME })?
            .try_into()
            .map_err(|e| NicError::program(&ifname, mode, e))
    }

    /// Attaches a program from [`Steering::load`] to its interface (native mode falling back
    /// to SKB mode as [`Steering::attach`] describes; refused with `EBUSY` if any program is
    /// attached). Does nothing if it is attached already.
    ///
    /// # Errors
    /// As [`Steering::attach`].
    pub fn attach_loaded(&mut self) -> Result<(), NicError> {
        self.attach_inner(None)
    }

    /// The steering program a dead xlb left attached to this interface (see [`Steering`]):
    /// the id of the attached program if it is `recorded` (the id the dead process wrote
    /// down when it attached) or is named [`PROGRAM_NAME`], and is not this one. `None` if no
    /// program or another one is attached. Reading program names needs CAP_SYS_ADMIN
    /// (`BPF_PROG_GET_NEXT_ID`); without it only `recorded` identifies the program. Call it
    /// from the interface's network namespace.
    ///
    /// # Errors
    /// [`NicError::UnknownInterface`], [`NicError::Netlink`].
    pub fn leftover(&self, recorded: Option<u32>) -> Result<Option<u32>, NicError> {
        let Some(a) = crate::iface::attached_xdp(&self.ifname)? else { return Ok(None) };
        if a.prog_id == self.prog_id {
            return Ok(None);
        }
        if recorded == Some(a.prog_id) {
            return Ok(Some(a.prog_id));
        }
        let named_ours = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .any(|p| p.id() == a.prog_id && p.name_as_str() == Some(PROGRAM_NAME));
        Ok(named_ours.then_some(a.prog_id))
    }

    /// Attaches like [`Steering::attach_loaded`], but if a steering program of a dead xlb is
    /// attached ([`Steering::leftover`] with `recorded`), replaces it in one step (the kernel swaps the
    /// programs; no frame meets neither) in the mode it ran in, and returns its id. The
    /// caller must know that no live xlb owns it (the running one on the admin socket would
    /// lose its interface).
    ///
    /// # Errors
    /// As [`Steering::attach`].
    pub fn attach_replacing_leftover(&mut self, recorded: Option<u32>) -> Result<Option<u32>, NicError> {
        let Some(old) = self.leftover(recorded)? else {
            self.attach_inner(None)?;
            return Ok(None);
        };
        let skb = crate::iface::attached_xdp(&self.ifname)?.is_some_and(|a| a.skb_mode);
        self.attach_inner(Some(if skb { XdpMode::Skb } else { XdpMode::Native }))?;
        Ok(Some(old))
    }

    /// `replace_in`: replace whatever program is attached, in that mode (no fallback).
    fn attach_inner(&mut self, replace_in: Option<XdpMode>) -> Result<(), NicError> {
        if self.attached {
            return Ok(());
        }
        let (ifname, prog_id, ifindex, mode) = (self.ifname.clone(), self.prog_id, self.ifindex, self.mode);
        let fd = self.program()?.fd().map_err(|e| NicError::program(&ifname, mode, e))?.as_fd().as_raw_fd();
        let flags = |m: XdpMode| match m {
            XdpMode::Native => crate::iface::XDP_FLAGS_DRV_MODE,
            XdpMode::Skb => crate::iface::XDP_FLAGS_SKB_MODE,
        };
        let attach_err = |mode, op, source| NicError::Attach { ifname: ifname.clone(), mode, op, source };
        let used_mode = if let Some(mode) = replace_in {
            crate::iface::set_xdp(&mut self.nl, ifindex, fd, flags(mode), None)
                .map_err(|e| attach_err(mode, "replace", e))?;
            mode
        } else {
            let noexist = crate::iface::XDP_FLAGS_UPDATE_IF_NOEXIST;
            match crate::iface::set_xdp(&mut self.nl, ifindex, fd, flags(mode) | noexist, None) {
                Ok(()) => mode,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENODEV) => {
                    return Err(NicError::UnknownInterface { ifname: ifname.clone() });
                }
                // EBUSY/EEXIST: another program is attached; SKB mode would not help.
                Err(e)
                    if mode == XdpMode::Native
                        && !matches!(e.raw_os_error(), Some(nix::libc::EBUSY | nix::libc::EEXIST)) =>
                {
                    warn!(
                        interface = %ifname,
                        error = %e,
                        "native XDP attach failed; falling back to SKB (generic) mode"
                    );
                    crate::iface::set_xdp(&mut self.nl, ifindex, fd, flags(XdpMode::Skb) | noexist, None)
                        .map_err(|e| attach_err(XdpMode::Skb, "attach", e))?;
                    XdpMode::Skb
                }
                Err(e) => return Err(attach_err(mode, "attach", e)),
            }
        };
        self.attached = true;
        self.mode = used_mode;
        info!(interface = %ifname, ifindex, mode = %used_mode, prog_id, "XDP steering attached");
        Ok(())
    }

    /// Interface name given to [`Steering::attach`].
    #[must_use]
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Interface index (in the namespace `attach` ran in).
    #[must_use]
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The mode the program actually runs in (after a possible fallback).
    #[must_use]
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// Kernel id of the loaded program (`bpftool prog show id N`).
    #[must_use]
    pub fn prog_id(&self) -> u32 {
        self.prog_id
    }

    /// Kernel ids of the program's maps (`bpftool map show id N`), in the order `xsks`,
    /// `services4`, `services4_index`, `services`, `vip_addrs`, `snat4`, `snat4_index`,
    /// `snat_addrs`, `endpoints4`, `endpoints4_index`, `endpoints`, `services6_index`,
    /// `snat6_index`, `endpoints6_index`, `endpoint_addr_filter`, `stats`, `l2_filter`,
    /// `l2_addrs`, `l2_self`.
    #[must_use]
    pub fn map_ids(&self) -> &[u32] {
        &self.map_ids
    }

    /// Puts the AF_XDP socket `socket` into slot `queue` of the `xsks` map: frames for xlb that
    /// arrive on receive queue `queue` go to it. The socket must already be bound to this
    /// interface and queue (`bind(2)` on an `AF_XDP` socket, see
    /// <https://docs.kernel.org/networking/af_xdp.html>), otherwise the kernel rejects it.
    /// Replaces any socket already in the slot. The map holds a reference to the socket;
    /// the kernel removes the entry when the socket is closed.
    ///
    /// # Errors
    /// [`NicError::InvalidArgument`] if `queue >= MAX_QUEUES`; [`NicError::Map`] if the kernel
    /// rejects the socket.
    pub fn set_xsk(&mut self, queue: u32, socket: &impl AsRawFd) -> Result<(), NicError> {
        check_queue(queue)?;
        self.xsks.set(queue, socket.as_raw_fd(), 0).map_err(|e| NicError::map(&self.ifname, MAP_XSKS, "set", e))
    }

    /// Empties slot `queue` of the `xsks` map: frames for xlb on that queue then pass to the
    /// kernel (counted in [`SteeringStats::redirect_failed`]). Emptying an empty slot is not an
    /// error.
    ///
    /// # Errors
    /// [`NicError::InvalidArgument`] if `queue >= MAX_QUEUES`; [`NicError::Map`] otherwise.
    pub fn clear_xsk(&mut self, queue: u32) -> Result<(), NicError> {
        check_queue(queue)?;
        match self.xsks.unset(queue) {
            Ok(()) => Ok(()),
            Err(e) if is_enoent(&e) => Ok(()),
            Err(e) => Err(NicError::map(&self.ifname, MAP_XSKS, "delete", e)),
        }
    }

    /// Compares the next sync of every map with the kernel's map itself (every entry written,
    /// every other key deleted) instead of with what the previous sync wrote. The control
    /// thread calls it once per `syncPeriod`, so the periodic resync repairs outside changes
    /// (SYNC-04); other syncs cost one system call per changed entry.
    pub fn verify_next_sync(&mut self) {
        self.shadow = Shadows::default();
        self.services4_index.verify = true;
        self.endpoints4_index.verify = true;
        self.snat4_index.verify = true;
        self.services6_index.verify = true;
        self.endpoints6_index.verify = true;
        self.snat6_index.verify = true;
        self.endpoint_addr_filter_verify = true;
    }

    /// Makes the `services4` (IPv4 keys) and `services` (IPv6 keys) maps equal to `keys`:
    /// inserts the new ones, then deletes the stale ones (in that order, so a key present
    /// before and after never disappears). Duplicates in `keys` are fine. Call it on every
    /// table publish. Only the entries that differ from the previous sync are written, unless
    /// the previous contents are not known (first sync, an error, or
    /// [`Steering::verify_next_sync`]). Frames to a listed (address, protocol,
    /// port) go to xlb, and so do ICMP errors quoting a packet sent from one (e.g. a NodePort
    /// reply from a node address).
    ///
    /// # Errors
    /// [`NicError::InvalidArgument`] for a protocol other than TCP/UDP/SCTP or more than
    /// [`MAX_SERVICES`] keys of one family (the maps are then unchanged); [`NicError::Map`] if
    /// the kernel refuses.
    pub fn sync_services(&mut self, keys: &[ServiceKey]) -> Result<(), NicError> {
        sync_pair(
            &self.ifname,
            (MAP_SERVICES4, &mut self.services4, &mut self.shadow.services4),
            (MAP_SERVICES, &mut self.services, &mut self.shadow.services),
            key_maps(keys)?,
            MAX_SERVICES,
        )?;
        self.sync_services_images()
    }

    /// Makes the `endpoints4` and `endpoints` maps equal to `keys`: (address, protocol, port)
    /// of the backends of NAT services. Frames *from* a listed endpoint go to xlb: replies of
    /// DNAT flows keep the client as destination, so only their source identifies them.
    ///
    /// # Errors
    /// As [`Steering::sync_services`], with [`MAX_ENDPOINTS`].
    pub fn sync_endpoints(&mut self, keys: &[ServiceKey]) -> Result<(), NicError> {
        sync_pair(
            &self.ifname,
            (MAP_ENDPOINTS4, &mut self.endpoints4, &mut self.shadow.endpoints4),
            (MAP_ENDPOINTS, &mut self.endpoints, &mut self.shadow.endpoints),
            key_maps(keys)?,
            MAX_ENDPOINTS,
        )?;
        self.sync_endpoints_images()
    }

    /// Makes the `vip_addrs` map equal to `addrs`. List here addresses wholly owned by xlb
    /// (ClusterIPs, LoadBalancer ingress IPs): ICMP errors and fragments to them go to xlb.
    /// Do not list the node's own addresses (NodePort services use [`Steering::sync_services`]
    /// entries with node addresses instead), or their fragments would leave the kernel.
    ///
    /// # Errors
    /// [`NicError::InvalidArgument`] for more than [`MAX_VIP_ADDRS`] addresses;
    /// [`NicError::Map`] if the kernel refuses.
    pub fn sync_vip_addrs(&mut self, addrs: &[IpAddr]) -> Result<(), NicError> {
        let want: FastMap<[u8; 16], u32> = addrs.iter().map(|a| (addr_bytes(*a), 0)).collect();
        check_len("vip_addrs", want.len(), MAX_VIP_ADDRS)?;
        sync_map(&self.ifname, MAP_VIP_ADDRS, &mut self.vip_addrs, &mut self.shadow.vip_addrs, want)
    }

    /// Makes the `snat4` (IPv4) and `snat_addrs` (IPv6) maps equal to `ranges`: `(address,
    /// first port, last port)`, ports
    /// inclusive and in host order. TCP/UDP/SCTP frames to the address with a destination port
    /// in the range (SNAT replies) go to xlb, and so do ICMP errors to the address that quote a
    /// packet whose source port lies in the range. Other traffic to the address (SSH, kubelet)
    /// still reaches the kernel: keep the range out of the kernel's own
    /// `net.ipv4.ip_local_port_range`. A later entry for the same address replaces an earlier.
    ///
    /// # Errors
    /// [`NicError::InvalidArgument`] if a range has first > last, an address is unspecified
    /// (`0.0.0.0`, `::`) or the IPv4 broadcast address, or there are more than
    /// [`MAX_SNAT_ADDRS`] addresses of one family (the maps are then unchanged);
    /// [`NicError::Map`] if the kernel refuses.
    pub fn sync_snat(&mut self, ranges: &[(IpAddr, u16, u16)]) -> Result<(), NicError> {
        let (mut want4, mut want6) = (FastMap::default(), FastMap::default());
        for &(addr, port_min, port_max) in ranges {
            if port_min > port_max {
                return Err(NicError::InvalidArgument {
                    field: "SNAT port range",
                    reason: format!("{addr}: first port {port_min} > last port {port_max}"),
                });
            }
            // Neither can be a packet's source; in `snat4_index` they mark empty slots and
            // tombstones (`index.rs`).
            if addr.is_unspecified() || ipv4_of(addr).is_some_and(|a| a.is_broadcast() || a.is_unspecified()) {
                return Err(NicError::InvalidArgument {
                    field: "SNAT address",
                    reason: format!("{addr} is not a unicast address"),
                });
            }
            let range = SnatRange { port_min, port_max }.to_array();
            match ipv4_of(addr) {
                Some(a) => want4.insert(a.octets(), range),
                None => want6.insert(addr_bytes(addr), range),
            };
        }
        check_len(MAP_SNAT4, want4.len(), MAX_SNAT_ADDRS)?;
        check_len(MAP_SNAT_ADDRS, want6.len(), MAX_SNAT_ADDRS)?;
        sync_map(&self.ifname, MAP_SNAT4, &mut self.snat4, &mut self.shadow.snat4, want4)?;
        self.snat4_index.sync(&self.ifname, snat4_entries(self.shadow.snat4.as_ref()))?;
        sync_map(&self.ifname, MAP_SNAT_ADDRS, &mut self.snat_addrs, &mut self.shadow.snat_addrs, want6)?;
        self.snat6_index.sync(&self.ifname, snat6_slots(self.shadow.snat_addrs.as_ref()))
    }

    /// Applies a difference to the `services4` and `services` maps: inserts `insert`, then
    /// deletes `remove`
    /// (a key in both stays). Unlike [`Steering::sync_services`] its map writes are what the
    /// lists hold, not what the map holds (the slot index and the filter are then brought to
    /// the whole key set as last written, compared in memory, writing only the slots and words
    /// that change); the caller must know that every other key is already
    /// right (a targeted sync after a change that touched only some services). Keys already
    /// written or already absent cost no system call. Returns `Ok(false)`, writing nothing,
    /// when the previous contents are not known (first sync, an error, or
    /// [`Steering::verify_next_sync`]): the caller then does a full sync.
    ///
    /// # Errors
    /// As [`Steering::sync_services`]; after one, the next sync compares with the kernel's map.
    pub fn update_services(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError> {
        let r = update_pair(
            &self.ifname,
            (MAP_SERVICES4, &mut self.services4, &mut self.shadow.services4),
            (MAP_SERVICES, &mut self.services, &mut self.shadow.services),
            (key_maps(insert)?, key_maps(remove)?),
            MAX_SERVICES,
        )
        .and_then(|done| if done { self.sync_services_images().map(|()| true) } else { Ok(false) });
        self.forget_on_error(r)
    }

    /// [`Steering::update_services`] for the `endpoints4` and `endpoints` maps.
    ///
    /// # Errors
    /// As [`Steering::sync_endpoints`].
    pub fn update_endpoints(&mut self, insert: &[ServiceKey], remove: &[ServiceKey]) -> Result<bool, NicError> {
        let r = update_pair(
            &self.ifname,
            (MAP_ENDPOINTS4, &mut self.endpoints4, &mut self.shadow.endpoints4),
            (MAP_ENDPOINTS, &mut self.endpoints, &mut self.shadow.endpoints),
            (key_maps(insert)?, key_maps(remove)?),
            MAX_ENDPOINTS,
        )
        .and_then(|done| if done { self.sync_endpoints_images().map(|()| true) } else { Ok(false) });
        self.forget_on_error(r)
    }

    /// [`Steering::update_services`] for the `vip_addrs` map.
    ///
    /// # Errors
    /// As [`Steering::sync_vip_addrs`].
    pub fn update_vip_addrs(&mut self, insert: &[IpAddr], remove: &[IpAddr]) -> Result<bool, NicError> {
        let ins: FastMap<[u8; 16], u32> = insert.iter().map(|a| (addr_bytes(*a), 0)).collect();
        let rem: FastMap<[u8; 16], u32> = remove.iter().map(|a| (addr_bytes(*a), 0)).collect();
        let Some(last) = &self.shadow.vip_addrs else { return Ok(false) };
        let r = check_len(MAP_VIP_ADDRS, len_after(last, &ins, &rem), MAX_VIP_ADDRS).and_then(|()| {
            update_map(&self.ifname, MAP_VIP_ADDRS, &mut self.vip_addrs, &mut self.shadow.vip_addrs, ins, rem)
        });
        self.forget_on_error(r)
    }

    /// Brings `services4_index` and `services6_index` to the keys of `services4` and
    /// `services` as last written (after their full sync or targeted update).
    fn sync_services_images(&mut self) -> Result<(), NicError> {
        self.services4_index.sync(&self.ifname, key8_entries(self.shadow.services4.as_ref()))?;
        self.services6_index.sync(&self.ifname, key20_entries(self.shadow.services.as_ref()))
    }

    /// [`Steering::sync_services_images`] for `endpoints4_index` and `endpoints6_index`, and
    /// `endpoint_addr_filter` for the addresses of both maps' keys.
    fn sync_endpoints_images(&mut self) -> Result<(), NicError> {
        self.endpoints4_index.sync(&self.ifname, key8_entries(self.shadow.endpoints4.as_ref()))?;
        self.endpoints6_index.sync(&self.ifname, key20_entries(self.shadow.endpoints.as_ref()))?;
        let (Some(v4), Some(v6)) = (&self.shadow.endpoints4, &self.shadow.endpoints) else { return Ok(()) };
        let (filter, map) = &mut self.endpoint_addr_filter;
        if std::mem::take(&mut self.endpoint_addr_filter_verify) {
            filter.reload(0, filter.len(), |i| map.get(&i, 0).ok());
        }
        let addr4 = v4.keys().map(|k| {
            let [a, b, c, d, ..] = *k;
            (addr_bytes(IpAddr::from([a, b, c, d])), 0)
        });
        let addr6 = v6.keys().map(|k| (k.first_chunk::<16>().copied().unwrap_or_default(), 0));
        let r = filter.apply(addr4.chain(addr6), |i, v| map.set(i, v, 0));
        if r.is_err() {
            self.endpoint_addr_filter_verify = true;
        }
        r.map(|_| ()).map_err(|e| NicError::map(&self.ifname, MAP_ENDPOINT_ADDR_FILTER, "update", e))
    }

    /// After a failed update the shadows may be wrong: the next sync compares with the kernel.
    fn forget_on_error(&mut self, r: Result<bool, NicError>) -> Result<bool, NicError> {
        if r.is_err() {
            self.verify_next_sync();
        }
        r
    }

    /// The IPv4 services that `services4_index` leaves to the `services4` hash map, because
    /// the 8 slots the program probes from their home were taken when they were placed
    /// (their frames cost the program the hash map's lookup as well); sorted. With the index
    /// at most half full, a handful in tens of thousands.
    #[must_use]
    pub fn services4_overflow(&self) -> Vec<ServiceKey> {
        self.services4_index.overflow()
    }

    /// The IPv4 SNAT addresses that `snat4_index` leaves to the `snat4` hash map (see
    /// [`Steering::services4_overflow`]); sorted.
    #[must_use]
    pub fn snat4_overflow(&self) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = self
            .snat4_index
            .index
            .overflow_entries()
            .map(|e| {
                let [a, b, c, d, ..] = e.to_ne_bytes();
                IpAddr::from([a, b, c, d])
            })
            .collect();
        v.sort();
        v
    }

    /// [`Steering::services4_overflow`] for the NAT backends of `endpoints4_index`.
    #[must_use]
    pub fn endpoints4_overflow(&self) -> Vec<ServiceKey> {
        self.endpoints4_index.overflow()
    }

    /// [`Steering::services4_overflow`] for the IPv6 services of `services6_index` (left to
    /// the `services` hash map); empty while the map's contents are not known (before the
    /// first sync, or after [`Steering::verify_next_sync`] until the next).
    #[must_use]
    pub fn services6_overflow(&self) -> Vec<ServiceKey> {
        overflow6(&self.services6_index, self.shadow.services.as_ref())
    }

    /// [`Steering::services6_overflow`] for the IPv6 SNAT addresses of `snat6_index` (every
    /// address of an id the index leaves to the `snat_addrs` hash map).
    #[must_use]
    pub fn snat6_overflow(&self) -> Vec<IpAddr> {
        let left: std::collections::HashSet<u64> =
            self.snat6_index.index.overflow_entries().map(|e| Form::Snat4.identity(e)).collect();
        let mut v: Vec<IpAddr> = self
            .shadow
            .snat_addrs
            .iter()
            .flat_map(|m| m.keys())
            .filter(|a| left.contains(&u64::from(snat6_id(a))))
            .map(|a| IpAddr::from(*a))
            .collect();
        v.sort();
        v
    }

    /// [`Steering::services6_overflow`] for the IPv6 NAT backends of `endpoints6_index`.
    #[must_use]
    pub fn endpoints6_overflow(&self) -> Vec<ServiceKey> {
        overflow6(&self.endpoints6_index, self.shadow.endpoints.as_ref())
    }

    /// Reads back the `services4` and `services` maps (for diagnostics such as `xlb status`),
    /// in no order.
    ///
    /// # Errors
    /// [`NicError::Map`] if iterating fails.
    pub fn services_in_map(&self) -> Result<Vec<ServiceKey>, NicError> {
        read_keys(&self.ifname, (MAP_SERVICES4, &self.services4), (MAP_SERVICES, &self.services))
    }

    /// Reads back the `endpoints4` and `endpoints` maps, in no order.
    ///
    /// # Errors
    /// [`NicError::Map`] if iterating fails.
    pub fn endpoints_in_map(&self) -> Result<Vec<ServiceKey>, NicError> {
        read_keys(&self.ifname, (MAP_ENDPOINTS4, &self.endpoints4), (MAP_ENDPOINTS, &self.endpoints))
    }

    /// Reads back the `l2_addrs` map (the addresses answered for in L2 mode), in no order.
    ///
    /// # Errors
    /// [`NicError::Map`] if iterating fails.
    pub fn l2_addrs_in_map(&self) -> Result<Vec<IpAddr>, NicError> {
        self.l2_addrs
            .keys()
            .map(|k| k.map(addr_from_bytes).map_err(|e| NicError::map(&self.ifname, MAP_L2_ADDRS, "iterate keys", e)))
            .collect()
    }

    /// A second handle on this program's `l2_addrs` map with a packet socket on its interface:
    /// what L2 announcement writes through ([`crate::L2Responder`]). Call it in the interface's
    /// network namespace (the packet socket and the interface's MAC are looked up there).
    ///
    /// # Errors
    /// [`NicError::Map`] if the map cannot be opened again by id; [`NicError::Packet`] if
    /// the interface's link address cannot be read or the packet socket cannot be opened.
    pub fn l2_responder(&self) -> Result<crate::L2Responder, NicError> {
        // `l2_filter`, `l2_addrs` and `l2_self` are the last three maps `load` opens.
        let n = self.map_ids.len();
        let id = |back: usize| n.checked_sub(back).and_then(|i| self.map_ids.get(i)).copied().unwrap_or_default();
        let data = MapData::from_id(id(3)).map_err(|e| NicError::map(&self.ifname, MAP_L2_FILTER, "open by id", e))?;
        let filter = aya::maps::Array::try_from(Map::Array(data))
            .map_err(|e| NicError::map(&self.ifname, MAP_L2_FILTER, "open by id", e))?;
        let data = MapData::from_id(id(2)).map_err(|e| NicError::map(&self.ifname, MAP_L2_ADDRS, "open by id", e))?;
        let map = HashMap::try_from(Map::HashMap(data))
            .map_err(|e| NicError::map(&self.ifname, MAP_L2_ADDRS, "open by id", e))?;
        let data = MapData::from_id(id(1)).map_err(|e| NicError::map(&self.ifname, MAP_L2_SELF, "open by id", e))?;
        let own = aya::maps::Array::try_from(Map::Array(data))
            .map_err(|e| NicError::map(&self.ifname, MAP_L2_SELF, "open by id", e))?;
        crate::L2Responder::new(&self.ifname, self.ifindex, map, filter, own)
    }

    /// Reads back the `vip_addrs` map, in no order.
    ///
    /// # Errors
    /// [`NicError::Map`] if iterating fails.
    pub fn vip_addrs_in_map(&self) -> Result<Vec<IpAddr>, NicError> {
        let keys = self
            .vip_addrs
            .keys()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| NicError::map(&self.ifname, MAP_VIP_ADDRS, "iterate keys", e))?;
        Ok(keys.into_iter().map(addr_from_bytes).collect())
    }

    /// Reads back the `snat4` and `snat_addrs` maps as `(address, first port, last port)`, in
    /// no order.
    ///
    /// # Errors
    /// [`NicError::Map`] if iterating fails.
    pub fn snat_in_map(&self) -> Result<Vec<(IpAddr, u16, u16)>, NicError> {
        let mut out = self
            .snat4
            .iter()
            .map(|r| r.map(|(k, [lo, hi])| (IpAddr::from(k), lo, hi)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| NicError::map(&self.ifname, MAP_SNAT4, "iterate", e))?;
        for r in self.snat_addrs.iter() {
            let (k, [lo, hi]) = r.map_err(|e| NicError::map(&self.ifname, MAP_SNAT_ADDRS, "iterate", e))?;
            out.push((addr_from_bytes(k), lo, hi));
        }
        Ok(out)
    }

    /// Reads the per-CPU `stats` array and sums it over the CPUs.
    ///
    /// # Errors
    /// [`NicError::Map`] if the lookup fails.
    pub fn stats(&self) -> Result<SteeringStats, NicError> {
        let read = |idx: u32| -> Result<u64, NicError> {
            let values = self.stats.get(&idx, 0).map_err(|e| NicError::map(&self.ifname, MAP_STATS, "lookup", e))?;
            Ok(values.iter().copied().fold(0u64, u64::wrapping_add))
        };
        Ok(SteeringStats {
            redirected: read(stat::REDIRECTED)?,
            passed: read(stat::PASSED)?,
            redirect_failed: read(stat::REDIRECT_FAILED)?,
            parse_errors: read(stat::PARSE_ERROR)?,
            l2_replied: read(stat::L2_REPLIED)?,
            l2_dropped: read(stat::L2_DROPPED)?,
            l2_other_host: read(stat::L2_OTHER_HOST)?,
        })
    }

    /// Detaches the program from the interface and closes the program and its maps, which the
    /// kernel then frees. Dropping a `Steering` does the same but can only log a failure.
    ///
    /// # Errors
    /// [`NicError::Program`] if detaching fails (the fds are closed all the same, which also
    /// detaches a BPF link).
    pub fn detach(mut self) -> Result<(), NicError> {
        self.detach_inner()
    }

    /// Closes this value's file descriptors but leaves the program attached (as a crash
    /// would): the next xlb replaces it in one step ([`Steering::attach_replacing_leftover`]),
    /// so no frame meets neither program. A hand-over ends with this on the old side.
    pub fn leave_attached(mut self) {
        self.attached = false;
        info!(interface = %self.ifname, prog_id = self.prog_id, "XDP steering left attached for the next xlb to replace");
    }

    fn detach_inner(&mut self) -> Result<(), NicError> {
        if !std::mem::replace(&mut self.attached, false) {
            return Ok(());
        }
        let (mode, ifname, ifindex) = (self.mode, self.ifname.clone(), self.ifindex);
        let fd = self.program()?.fd().map_err(|e| NicError::program(&ifname, mode, e))?.as_fd().as_raw_fd();
        let flags = match mode {
            XdpMode::Native => crate::iface::XDP_FLAGS_DRV_MODE,
            XdpMode::Skb => crate::iface::XDP_FLAGS_SKB_MODE,
        };
        // Only if ours is still the program attached: a newer xlb may have replaced it.
        match crate::iface::set_xdp(&mut self.nl, ifindex, -1, flags, Some(fd)) {
            Ok(()) => info!(interface = %ifname, prog_id = self.prog_id, "XDP steering detached"),
            Err(e) if matches!(e.raw_os_error(), Some(nix::libc::EEXIST | nix::libc::ENODEV)) => {
                info!(interface = %ifname, prog_id = self.prog_id, error = %e, "XDP steering no longer attached (replaced, or the interface is gone)");
            }
            Err(e) => return Err(NicError::Attach { ifname, mode, op: "detach", source: e }),
        }
        Ok(())
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        if let Err(e) = self.detach_inner() {
            warn!(interface = %self.ifname, error = %e, "detaching XDP steering failed");
        }
    }
}

/// The processes other than this one that hold a file descriptor of BPF program `prog_id`, by
/// process id, in ascending order. A running xlb holds its steering program's fd for as long
/// as it lives; a program a dead xlb left attached is held by no process (only by the
/// interface). Read from `/proc/PID/fd` (links `anon_inode:bpf-prog`) and
/// `/proc/PID/fdinfo/FD` (its `prog_id:` line, kernel 4.14 and later), so only processes of
/// the calling process's PID namespace are seen, and only those whose fds it may read (all of
/// them as root). A process that exits during the scan, or whose entries cannot be read, is
/// left out; no `/proc` gives an empty list.
#[must_use]
pub fn program_holders(prog_id: u32) -> Vec<u32> {
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<u32> = procs
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && holds_program(pid, prog_id))
        .collect();
    pids.sort_unstable();
    pids
}

/// Detaches the steering program a dead xlb left attached to `ifname` (`xlb cleanup`): the
/// attached program if it is `recorded` (the id the dead process wrote down) or is named
/// [`PROGRAM_NAME`] (reading names needs CAP_SYS_ADMIN), in the mode it runs in. Returns its
/// id; `None` when no program, or another tool's, is attached (that one stays). The caller
/// must know that no running process holds it ([`program_holders`]). Call it from the
/// interface's network namespace.
///
/// # Errors
/// [`NicError::UnknownInterface`], [`NicError::Netlink`], [`NicError::Attach`] (op
/// `detach`).
pub fn detach_leftover(ifname: &str, recorded: Option<u32>) -> Result<Option<u32>, NicError> {
    let Some(a) = crate::iface::attached_xdp(ifname)? else { return Ok(None) };
    let ours = recorded == Some(a.prog_id)
        || aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .any(|p| p.id() == a.prog_id && p.name_as_str() == Some(PROGRAM_NAME));
    if !ours {
        return Ok(None);
    }
    let (mode, flags) = if a.skb_mode {
        (XdpMode::Skb, crate::iface::XDP_FLAGS_SKB_MODE)
    } else {
        (XdpMode::Native, crate::iface::XDP_FLAGS_DRV_MODE)
    };
    let ifindex = crate::iface::ifindex(ifname)?;
    let mut nl = crate::nl::RouteSocket::new("RTM_SETLINK IFLA_XDP")?;
    crate::iface::set_xdp(&mut nl, ifindex, -1, flags, None).map_err(|source| NicError::Attach {
        ifname: ifname.to_owned(),
        mode,
        op: "detach",
        source,
    })?;
    Ok(Some(a.prog_id))
}

/// Whether process `pid` has an fd of BPF program `prog_id` (see [`program_holders`]).
fn holds_program(pid: u32, prog_id: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.filter_map(Result::ok).any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:bpf-prog")
            && std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy())).is_ok_and(
                |info| {
                    info.lines()
                        .filter_map(|l| l.strip_prefix("prog_id:"))
                        .any(|v| v.trim().parse::<u32>() == Ok(prog_id))
                },
            )
    })
}

fn check_queue(queue: u32) -> Result<(), NicError> {
    if queue >= MAX_QUEUES {
        return Err(NicError::InvalidArgument {
            field: "queue",
            reason: format!("{queue} is not below the xsks map size {MAX_QUEUES}"),
        });
    }
    Ok(())
}

fn check_len(map: &'static str, len: usize, max: usize) -> Result<(), NicError> {
    if len > max {
        return Err(NicError::InvalidArgument {
            field: map,
            reason: format!("{len} entries exceed the map's capacity of {max}"),
        });
    }
    Ok(())
}

fn is_enoent(e: &MapError) -> bool {
    matches!(e, MapError::KeyNotFound)
        || matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(nix::libc::ENOENT))
}

/// Upserts every `(key, value)` of `want`, then deletes the keys not in `want`.
fn sync_map<K, V>(
    ifname: &str,
    name: &'static str,
    map: &mut HashMap<MapData, K, V>,
    shadow: &mut Option<FastMap<K, V>>,
    want: FastMap<K, V>,
) -> Result<(), NicError>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod + PartialEq,
{
    let Some(last) = shadow.as_mut() else {
        // Full pass: write every entry, delete whatever else the kernel's map holds.
        for (k, v) in &want {
            map.insert(*k, *v, 0).map_err(|e| NicError::map(ifname, name, "insert", e))?;
        }
        let stale: Vec<K> = map
            .keys()
            .collect::<Result<Vec<K>, _>>()
            .map_err(|e| NicError::map(ifname, name, "iterate keys", e))?
            .into_iter()
            .filter(|k| !want.contains_key(k))
            .collect();
        for k in &stale {
            remove_key(ifname, name, map, k)?;
        }
        *shadow = Some(want);
        return Ok(());
    };
    // Difference against what the last sync wrote: one system call per changed entry.
    for (k, v) in &want {
        if last.get(k) != Some(v) {
            // Forget the entry first, so a failure leaves the shadow no more optimistic than
            // the map (the next sync writes it again).
            last.remove(k);
            map.insert(*k, *v, 0).map_err(|e| NicError::map(ifname, name, "insert", e))?;
        }
    }
    let gone: Vec<K> = last.keys().filter(|k| !want.contains_key(*k)).copied().collect();
    for k in &gone {
        remove_key(ifname, name, map, k)?;
        last.remove(k);
    }
    *shadow = Some(want);
    Ok(())
}

/// The number of entries a map whose contents are `last` holds after an update that inserts
/// `insert` and deletes the keys of `remove` not in `insert`.
fn len_after<K, V>(last: &FastMap<K, V>, insert: &FastMap<K, V>, remove: &FastMap<K, V>) -> usize
where
    K: Eq + std::hash::Hash,
{
    let added = insert.keys().filter(|k| !last.contains_key(*k)).count();
    let removed = remove.keys().filter(|k| !insert.contains_key(*k) && last.contains_key(*k)).count();
    last.len() + added - removed
}

/// Inserts `insert`, then deletes the keys of `remove` not in `insert`, writing only what
/// differs from `shadow` (which it keeps up to date). `Ok(false)` when `shadow` is unknown.
/// The caller checks the map's capacity first ([`len_after`]).
fn update_map<K, V>(
    ifname: &str,
    name: &'static str,
    map: &mut HashMap<MapData, K, V>,
    shadow: &mut Option<FastMap<K, V>>,
    insert: FastMap<K, V>,
    remove: FastMap<K, V>,
) -> Result<bool, NicError>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod + PartialEq,
{
    let Some(last) = shadow.as_mut() else {
        return Ok(false);
    };
    for (k, v) in &insert {
        if last.get(k) != Some(v) {
            last.remove(k);
            map.insert(*k, *v, 0).map_err(|e| NicError::map(ifname, name, "insert", e))?;
            last.insert(*k, *v);
        }
    }
    for k in remove.keys().filter(|k| !insert.contains_key(*k)) {
        if last.contains_key(k) {
            remove_key(ifname, name, map, k)?;
            last.remove(k);
        }
    }
    Ok(true)
}

/// One family's map of a pair: its name, the map, and its shadow.
type Member<'a, K> = (&'static str, &'a mut HashMap<MapData, K, u32>, &'a mut Option<FastMap<K, u32>>);

/// [`sync_map`] for a pair of maps, IPv4 (`services4`, `endpoints4`) and IPv6 (`services`,
/// `endpoints`): both maps' capacities (`max` each) are checked before either is written.
fn sync_pair(
    ifname: &str,
    (name4, map4, shadow4): Member<'_, [u8; Service4MapKey::LEN]>,
    (name6, map6, shadow6): Member<'_, [u8; ServiceMapKey::LEN]>,
    (want4, want6): KeyMaps,
    max: usize,
) -> Result<(), NicError> {
    check_len(name4, want4.len(), max)?;
    check_len(name6, want6.len(), max)?;
    sync_map(ifname, name4, map4, shadow4, want4)?;
    sync_map(ifname, name6, map6, shadow6, want6)
}

/// [`update_map`] for a pair of maps, IPv4 (`services4`, `endpoints4`) and IPv6 (`services`,
/// `endpoints`): `Ok(false)`, writing nothing, unless both shadows are known; both maps'
/// capacities (`max` each) are checked before either is written.
fn update_pair(
    ifname: &str,
    (name4, map4, shadow4): Member<'_, [u8; Service4MapKey::LEN]>,
    (name6, map6, shadow6): Member<'_, [u8; ServiceMapKey::LEN]>,
    ((ins4, ins6), (rem4, rem6)): (KeyMaps, KeyMaps),
    max: usize,
) -> Result<bool, NicError> {
    let (Some(last4), Some(last6)) = (shadow4.as_ref(), shadow6.as_ref()) else { return Ok(false) };
    check_len(name4, len_after(last4, &ins4, &rem4), max)?;
    check_len(name6, len_after(last6, &ins6, &rem6), max)?;
    update_map(ifname, name4, map4, shadow4, ins4, rem4)?;
    update_map(ifname, name6, map6, shadow6, ins6, rem6)
}

/// The keys of a pair of maps, IPv4 (`services4`, `endpoints4`) and IPv6 (`services`,
/// `endpoints`), as [`ServiceKey`]s.
fn read_keys(
    ifname: &str,
    (name4, v4): (&'static str, &HashMap<MapData, [u8; Service4MapKey::LEN], u32>),
    (name6, v6): (&'static str, &HashMap<MapData, [u8; ServiceMapKey::LEN], u32>),
) -> Result<Vec<ServiceKey>, NicError> {
    let mut out = Vec::new();
    for k in v4.keys() {
        let k = k.map_err(|e| NicError::map(ifname, name4, "iterate keys", e))?;
        out.push(Service4MapKey::from_bytes(&k).to_service_key());
    }
    for k in v6.keys() {
        let k = k.map_err(|e| NicError::map(ifname, name6, "iterate keys", e))?;
        out.push(ServiceMapKey::from_bytes(&k).to_service_key());
    }
    Ok(out)
}

/// Deletes `k` from the map; already absent is fine.
fn remove_key<K, V>(ifname: &str, name: &'static str, map: &mut HashMap<MapData, K, V>, k: &K) -> Result<(), NicError>
where
    K: aya::Pod,
    V: aya::Pod,
{
    match map.remove(k) {
        Ok(()) => Ok(()),
        Err(e) if is_enoent(&e) => Ok(()),
        Err(e) => Err(NicError::map(ifname, name, "delete", e)),
    }
}
