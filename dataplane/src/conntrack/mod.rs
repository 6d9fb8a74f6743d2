//! Per-worker connection tracking: a flow table built for this job.
//!
//! # Layout
//!
//! One table per address family per worker, two arrays in anonymous memory
//! (`mem::Region`, `MADV_HUGEPAGE`):
//!
//! - **records** ([`FlowRecord`]), a slab of `capacity` fixed-size records, one per flow: 64
//!   bytes for IPv4 (one cache line), 128 for IPv6. A record holds the flow's two tuples, its
//!   state and expiry, and everything the rewrite needs, precomputed ([`FlowRecord`]).
//! - **buckets** ([`Bucket`]), one cache line each: eight 16-bit tags, eight references into
//!   the slab, eight eviction hints and an overflow count. A NAT flow has two entries that
//!   point at its one record: the **forward** entry (the client's tuple) and the **reply**
//!   entry (the tuple of the backend's replies), as VPP's NAT44-ED session table does; a DSR
//!   flow has only the forward entry (its replies bypass the load balancer).
//!
//! # Lookup
//!
//! The key is packed into machine words and hashed **once per packet** with a keyed hash
//! (folded 64×64→128-bit multiplies, as foldhash and wyhash do) whose seeds are drawn at
//! random per table, since keys come from attackers (crates.md §6). The high 32 bits pick the
//! home bucket (multiply-shift range reduction, so any bucket count works), the low 16 bits
//! are the tag. A lookup compares the eight tags at once (SSE2 `pcmpeqw` + `pmovmskb` on
//! x86-64), then checks the full key in the record of each match (about one in 8,000 lookups
//! sees a false tag match). Entries that did not fit their home bucket go to the next bucket
//! with room; each bucket counts how many entries passed it (F14's overflow counts), so a
//! lookup stops at the first bucket whose count is zero: almost always the home bucket. The
//! same probe serves the insert after a miss (find-or-insert in one probe), and the batch
//! pipeline prefetches the home bucket, then the record of the first tag match, before it
//! looks ([`Conntrack::hash`], [`View::prefetch`], [`View::probe`], [`ViewMut::resolve`]).
//!
//! # Capacity, eviction, expiry
//!
//! Buckets are sized so that with every record in use (two entries per flow) at most
//! [`TARGET_LOAD`] of the slots are taken. When every record is in use, a new flow takes the
//! record of the oldest not-yet-established TCP flow whose entry is in the new flow's home
//! bucket, or failing one there in the next buckets (each slot carries a hint: evictable or
//! not, and the second it was inserted), like Linux's `early_drop` of unassured entries and
//! Katran's LRU: a SYN flood against a full table costs O(1) per SYN. Failing that, at most
//! once a second the next [`RECLAIM_BUDGET`] records of the sweep's current step are swept and
//! the not-established flows among them evicted; else the new flow is refused ([`InsertError::Full`]).
//!
//! Expiry is checked on lookup ([`Conntrack::lookup`]) and by the sweep, which visits one
//! [`SHARDS`]th of the slab per step ([`Conntrack::sweep`]); the batch pipeline starts a step
//! every `sweep_interval_ms` and does it a bounded number of records per batch
//! ([`Conntrack::sweep_begin`], [`Conntrack::sweep_some`]), so that expiring many flows at once
//! does not hold up one batch for milliseconds. Timeouts follow IPVS (`ipvsadm --set`; seed
//! CT-04): established 900 s, FIN 120 s, UDP 300 s, all configurable.
//!
//! # Memory
//!
//! The arrays are reserved whole and committed page by page as they are first written, so a
//! table nobody uses costs nothing. A worker commits its tables before it takes traffic
//! ([`Conntrack::prefault`]): the first write to a page of a huge-page region otherwise
//! faults on the packet path, where it zeroes 2 MiB and may wait for the kernel to compact
//! memory (up to 4.9 ms measured for one batch, docs/benchmarks.md). A worker's memory is then
//! its tables' full size from the start, as with Katran's and Cilium's preallocated maps.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod mem;

use bytemuck::{Pod, Zeroable};

use crate::addr::{Family, V4, V6};
use crate::hash::fold_mul;
use crate::prefetch;
use crate::tables::BackendRef;
use crate::wire::tcp_flags;
use mem::Region;

/// Most records a full table's reclaim visits (at most once a second, inside the insert that
/// found no room; see [`Conntrack::insert`]): it expires and, if the table is still full,
/// evicts the not-established flows among the next `RECLAIM_BUDGET` records of the sweep's
/// current step.
pub const RECLAIM_BUDGET: u32 = 256;

/// Steps of the incremental sweep per pass over the slab (each [`Conntrack::sweep`] call visits
/// one step's share of the records in use).
pub const SHARDS: usize = 64;

/// Entries per bucket (one 64-byte cache line).
pub const SLOTS: usize = 8;

/// Largest share of bucket slots in use when every record is (two entries per flow). With 8
/// slots per bucket, 5 of 8 on average leaves about 7 % of buckets spilling into the next one
/// at full capacity, about 3 % at the 80 % a table usually runs at.
pub const TARGET_LOAD: f64 = 0.625;

/// Buckets an entry may be displaced over before an insert gives up. At [`TARGET_LOAD`] about
/// 12 % of the buckets are full, and under a sustained SYN flood into a full table (every
/// insert evicts) runs of up to 10 full buckets were seen in a snapshot of 104,858; with a
/// limit of 16, about 1 insert in 20 million met a longer run and was refused after its
/// eviction; with 32, none in 120 million (docs/benchmarks.md, "A new flow refused after its
/// eviction"). A probe stops long before the limit, at the first bucket without overflow (a
/// lookup) or with a free slot (an insert).
pub const MAX_PROBE: usize = 32;

/// Buckets a full table looks at, one at a time from the new flow's home bucket, for a flow to
/// evict: a new flow whose home bucket holds no evictable entry (empty in about 1 in 150 cases
/// at full capacity, `e^-5` at [`TARGET_LOAD`]; or all its flows established) still gets in by
/// evicting a little further on instead of being refused.
pub const EVICT_REACH: usize = 8;

/// Index of a record in the slab.
pub type RecId = u32;

/// A flow's 5-tuple. For IPv4 this is 13 bytes of data.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct FlowKey<A> {
    /// Source address.
    pub src: A,
    /// Destination address.
    pub dst: A,
    /// Source port (ICMP: identifier).
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol number.
    pub proto: u8,
}

/// TCP connection state as xlb tracks it (a reduced IPVS state table, `ip_vs_proto_tcp.c`).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default)]
#[repr(u8)]
pub enum CtState {
    /// Not TCP (UDP, SCTP): one state, `udp` timeout.
    #[default]
    Datagram = 0,
    /// SYN seen, handshake not finished.
    SynSent = 1,
    /// Data flowing.
    Established = 2,
    /// FIN seen in either direction.
    FinWait = 3,
    /// RST seen.
    Closed = 4,
}

impl CtState {
    /// Every state, by number.
    pub const ALL: [Self; 5] = [Self::Datagram, Self::SynSent, Self::Established, Self::FinWait, Self::Closed];

    /// Whether the flow counts as an active connection for `lc`/`wlc`/`sed`/`nq` (IPVS
    /// counts established TCP as active; here datagram flows count as active too).
    #[inline]
    pub fn is_active(self) -> bool {
        matches!(self, Self::Datagram | Self::SynSent | Self::Established)
    }

    /// Whether a full table may evict the flow early (not yet established TCP, or closing):
    /// Linux conntrack's "unassured" entries.
    #[inline]
    pub fn is_evictable(self) -> bool {
        !matches!(self, Self::Established | Self::Datagram)
    }

    /// The state of number `n` (see the discriminants); `Closed` for unknown numbers.
    #[inline]
    pub fn from_u8(n: u8) -> Self {
        match n {
            0 => Self::Datagram,
            1 => Self::SynSent,
            2 => Self::Established,
            3 => Self::FinWait,
            _ => Self::Closed,
        }
    }

    /// Name for `xlb conntrack`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Datagram => "UDP",
            Self::SynSent => "SYN_SENT",
            Self::Established => "ESTABLISHED",
            Self::FinWait => "FIN_WAIT",
            Self::Closed => "CLOSE",
        }
    }
}

/// Flow flags ([`FlowRecord::flags`]).
pub mod flow_flags {
    /// The flow's source is rewritten to the SNAT address and port (`reply_dst`,
    /// `reply_dport`).
    pub const SNAT: u8 = 0x01;
    /// Direct server return: no reply entry (replies bypass xlb).
    pub const DSR: u8 = 0x02;
    /// DSR by IPIP / IP6IP6 encapsulation (else by MAC rewrite only); `reply_dst` holds the
    /// outer source address.
    pub const ENCAP: u8 = 0x04;
    /// The reply entry was taken over by a newer flow with the same reply tuple (the same
    /// client address and port reaching the same backend through another frontend) while this
    /// flow was not live (not yet established, or closing), or released for a frontend
    /// ([`super::Conntrack::release_reply`]): this flow's replies are no longer recognised.
    /// Its reply entry is not removed with it.
    pub const NO_REPLY: u8 = 0x08;
    /// Set by the batch pipeline while a packet of this flow waits for the slow path, so later
    /// packets of the same flow in that batch wait too (keeps per-flow order).
    pub const DEFERRED: u8 = 0x10;
    /// The flow's two ports (where the client's packets arrive, `in_port`, and where they
    /// leave, `out_port`) have different MTUs, so a packet of it may not fit the port it leaves
    /// on (NAT does not grow packets: only there). Set with the next hop when the tables'
    /// generation is stamped; the fast stage checks such a flow's packets against the MTU of
    /// the port each leaves on and leaves the larger ones to the slow path, which answers them
    /// (RFC 1191 / RFC 8201). Not set for encapsulating flows, whose packets the fast stage
    /// checks for the outer header too.
    pub const MTU_CHECK: u8 = 0x20;
}

/// One flow: its tuples, state and the precomputed rewrite. `Pod`, so the slab lives in plain
/// mapped memory; `#[repr(C, packed)]` with the fields ordered so that every `u32` and `u16` is
/// naturally aligned inside a record, each entry's key lies in the order of [`FlowKey`]'s
/// fields (forward: `client, vip` then `cport, vport`; reply: `backend_addr, reply_dst` then
/// `bport, reply_dport`), and `P` pads the record to 64 bytes (IPv4) or 128 bytes (IPv6): a
/// record never straddles more cache lines than it must.
///
/// Forward packets (client → frontend) have the tuple `(client, vip, cport, vport)` and leave
/// with `(reply_dst, backend_addr, reply_dport, bport)`; replies come back with the mirror of
/// that and leave as `(vip, client, vport, cport)`. For DNAT flows `reply_dst`/`reply_dport` are
/// the client's own address and port; for SNAT flows the SNAT address and port; for IPIP DSR
/// flows `reply_dst` is the outer source address. The checksum deltas are RFC 1624 sums of
/// `~old + new` over the changed words, ready to add: the IPv4 header's over the addresses with
/// the TTL decrement folded in (the constant [`crate::csum::TTL_DEC`]), one per direction, and
/// the transport checksum's over addresses and ports for forward packets (a reply's is its
/// one's-complement negation), each kept in wire order ([`crate::csum::wire`]) so that the
/// rewrite applies it to the checksum field without swapping bytes. IPIP DSR flows keep their
/// 32-bit flow hash (the IPv6 flow label, RFC 6438) in the two IPv4 header deltas, which
/// encapsulation does not use.
#[derive(Copy, Clone, Pod, Zeroable, Debug)]
#[repr(C, packed)]
pub struct FlowRecord<A, P> {
    /// The backend ([`BackendRef`]; stale once the backend leaves the tables).
    pub backend: BackendRef,
    /// Expiry, in worker seconds.
    pub expires_s: u32,
    /// Low 32 bits of the [`crate::tables::Tables::generation`] the rewrite fields were computed
    /// for; a packet that sees another generation takes the slow path, which checks the backend
    /// and refreshes them. 0 = never computed.
    pub generation: u32,
    /// Service id (the index of the per-service counters).
    pub svc: u32,
    /// Client address.
    pub client: A,
    /// Frontend (VIP) address.
    pub vip: A,
    /// Backend address.
    pub backend_addr: A,
    /// Source of the rewritten forward packets and destination of the replies: the client
    /// (DNAT), the SNAT address (SNAT) or the outer source (IPIP DSR).
    pub reply_dst: A,
    /// Client port (host order).
    pub cport: u16,
    /// Frontend port.
    pub vport: u16,
    /// Backend port.
    pub bport: u16,
    /// Source port of the rewritten forward packets (the client's, or the SNAT port).
    pub reply_dport: u16,
    /// RFC 1624 delta of the IPv4 header checksum of forward packets (addresses, TTL), in wire
    /// order ([`crate::csum::wire`]).
    pub ip_delta_fwd: u16,
    /// RFC 1624 delta of the IPv4 header checksum of replies (addresses, TTL), in wire order.
    pub ip_delta_rev: u16,
    /// RFC 1624 delta of the transport checksum of forward packets (addresses and ports), in
    /// wire order.
    pub l4_delta: u16,
    /// IP protocol.
    pub proto: u8,
    /// [`CtState`] number; [`FlowRecord::FREE`] for an unused record.
    pub state: u8,
    /// [`flow_flags`].
    pub flags: u8,
    /// Port the client's packets arrived on: replies leave there.
    pub in_port: u8,
    /// Port forward packets leave on (the next hop's).
    pub out_port: u8,
    /// Reserved, zero.
    pub reserved: u8,
    /// Source MAC of the client side's packets: replies go back to it.
    pub peer_mac: [u8; 6],
    /// MAC of the forward next hop (the backend or its gateway).
    pub hop_mac: [u8; 6],
    /// Padding to the record size.
    pub pad: P,
}

/// The record type of family `A`.
pub type Rec<A> = FlowRecord<A, <A as CtFamily>::Pad>;

/// Prefetches record `r` whole: its first cache line, and for a record of two lines (IPv6's
/// 128 bytes, whose second line holds the reply address, the ports, the deltas and the MACs)
/// the second too. For IPv4's 64-byte record the second prefetch is compiled out.
#[inline(always)]
fn prefetch_rec<A: CtFamily>(r: &Rec<A>) {
    prefetch(r);
    if core::mem::size_of::<Rec<A>>() > 64
        && let Some(b) = bytemuck::bytes_of(r).get(64)
    {
        prefetch(b);
    }
}

impl<A: CtFamily> FlowRecord<A, A::Pad> {
    /// `state` of an unused record.
    pub const FREE: u8 = 0xff;

    /// The client's tuple (the forward entry's key).
    #[inline]
    pub fn fwd_key(&self) -> FlowKey<A> {
        FlowKey { src: self.client, dst: self.vip, sport: self.cport, dport: self.vport, proto: self.proto }
    }

    /// The tuple of the backend's replies (the reply entry's key).
    #[inline]
    pub fn reply_key(&self) -> FlowKey<A> {
        FlowKey {
            src: self.backend_addr,
            dst: self.reply_dst,
            sport: self.bport,
            dport: self.reply_dport,
            proto: self.proto,
        }
    }

    /// The key of the entry of direction `dir`.
    #[inline]
    pub fn key(&self, dir: Dir) -> FlowKey<A> {
        match dir {
            Dir::Forward => self.fwd_key(),
            Dir::Reply => self.reply_key(),
        }
    }

    /// Whether the flow has (and still owns) a reply entry.
    #[inline]
    pub fn has_reply(&self) -> bool {
        self.flags & (flow_flags::DSR | flow_flags::NO_REPLY) == 0
    }

    /// The TCP/flow state.
    #[inline]
    pub fn ct_state(&self) -> CtState {
        CtState::from_u8(self.state)
    }

    /// Whether the record is in use: not marked [`FlowRecord::FREE`]. A record the table never
    /// handed out (at or above its high-water mark: zero memory, state 0) reads as in use too;
    /// the table's own walks stop at that mark, and [`Conntrack::remove`] checks it.
    #[inline]
    pub fn in_use(&self) -> bool {
        self.state != Self::FREE
    }

    /// An empty record (zeroes; [`FlowRecord::FREE`] is set by the table, not here).
    pub fn zeroed_record() -> Self {
        Zeroable::zeroed()
    }
}

/// Address families the flow table supports: the record padding and the key hash.
pub trait CtFamily: Family {
    /// Padding that brings [`FlowRecord`] to 64 (IPv4) or 128 (IPv6) bytes.
    type Pad: Pod + core::fmt::Debug;
    /// The keyed hash of a key (see the module docs); `seeds` are the table's random seeds.
    fn hash_key(k: &FlowKey<Self>, seeds: &[u64; 5]) -> u64;

    /// Whether the entry of direction `dir` of record `r` has key `k` (`r.key(dir) == *k`).
    #[inline(always)]
    fn key_is(r: &Rec<Self>, dir: Dir, k: &FlowKey<Self>) -> bool {
        r.key(dir) == *k
    }
}

#[inline]
fn ports_word(k: &FlowKey<impl Copy>) -> u64 {
    u64::from(k.sport) | u64::from(k.dport) << 16 | u64::from(k.proto) << 32
}

impl CtFamily for V4 {
    type Pad = [u8; 0];
    #[inline]
    fn hash_key(k: &FlowKey<Self>, s: &[u64; 5]) -> u64 {
        let [a, b, c, d] = k.src.0;
        let [e, f, g, h] = k.dst.0;
        let addrs = u64::from_le_bytes([a, b, c, d, e, f, g, h]);
        fold_mul(fold_mul(addrs ^ s[0], ports_word(k) ^ s[1]), s[2])
    }

    /// Three compares instead of five: an entry's two addresses are 8 adjacent bytes of the
    /// record and its two ports 4 (see [`FlowRecord`]'s layout), each compared as one word
    /// with the same bytes of the key; then the protocol.
    #[inline(always)]
    fn key_is(r: &Rec<Self>, dir: Dir, k: &FlowKey<Self>) -> bool {
        use core::mem::offset_of;
        const ADDRS: usize = offset_of!(Rec<V4>, client);
        const PORTS: usize = offset_of!(Rec<V4>, cport);
        const _: () =
            assert!(offset_of!(Rec<V4>, backend_addr) == ADDRS + 8 && offset_of!(Rec<V4>, bport) == PORTS + 4);
        let b = bytemuck::bytes_of(r);
        let d = usize::from(dir == Dir::Reply);
        let (Some(a), Some(p)) = (
            b.get(ADDRS + 8 * d..).and_then(|x| x.first_chunk::<8>()),
            b.get(PORTS + 4 * d..).and_then(|x| x.first_chunk::<4>()),
        ) else {
            return false;
        };
        let [k0, k1, k2, k3] = k.src.0;
        let [k4, k5, k6, k7] = k.dst.0;
        // The ports' bytes in memory order, as `u32::from_ne_bytes` reads the record's.
        let (first, second) = (u32::from(k.sport), u32::from(k.dport));
        let ports = if cfg!(target_endian = "little") { first | second << 16 } else { first << 16 | second };
        u64::from_ne_bytes(*a) == u64::from_ne_bytes([k0, k1, k2, k3, k4, k5, k6, k7])
            && u32::from_ne_bytes(*p) == ports
            && r.proto == k.proto
    }
}

impl CtFamily for V6 {
    type Pad = [u8; 16];
    #[inline]
    fn hash_key(k: &FlowKey<Self>, s: &[u64; 5]) -> u64 {
        let w = |b: &[u8; 16], hi: bool| {
            let h: &[u8; 8] = if hi { b.last_chunk().unwrap_or(&[0; 8]) } else { b.first_chunk().unwrap_or(&[0; 8]) };
            u64::from_le_bytes(*h)
        };
        let x = fold_mul(w(&k.src.0, false) ^ s[0], w(&k.src.0, true) ^ s[1]);
        let y = fold_mul(w(&k.dst.0, false) ^ s[2], w(&k.dst.0, true) ^ s[3]);
        fold_mul(x ^ ports_word(k), y ^ s[4])
    }
}

/// Which of a flow's two entries a lookup found.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Dir {
    /// The client's tuple: a packet from client to frontend.
    Forward,
    /// The reply tuple: a packet from the backend.
    Reply,
}

/// A found entry: the record, the direction, and where the entry sits (so the caller can update
/// its eviction hint without probing again).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Hit {
    /// The record.
    pub id: RecId,
    /// Which entry matched.
    pub dir: Dir,
    /// Bucket index.
    pub bucket: u32,
    /// Slot in the bucket (0..[`SLOTS`]).
    pub slot: u8,
}

/// Why an insert failed.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum InsertError {
    /// No record could be freed, or (never seen at [`TARGET_LOAD`]) no bucket slot was free
    /// within [`MAX_PROBE`] buckets.
    Full,
    /// The new flow's reply tuple (backend address and port to client address and port) is
    /// the reply tuple of a live flow: an established TCP flow or a datagram flow, not past its
    /// expiry. That flow keeps it, and the new flow is not inserted: its replies could not be
    /// told from the older flow's. Linux conntrack drops such a packet as a clash
    /// (`insert_failed`); the new flow's next packet tries again.
    ReplyTupleInUse,
}

/// A removed or expired flow, handed to the caller so it can fix per-backend counts.
#[derive(Copy, Clone, Debug)]
pub struct Removed {
    /// Backend of the flow.
    pub backend: BackendRef,
    /// State at removal.
    pub state: CtState,
    /// Whether it was removed early to make room (else it expired).
    pub evicted: bool,
}

/// One cache line of the index: eight entries.
#[derive(Copy, Clone, Pod, Zeroable, Debug)]
#[repr(C, align(64))]
pub struct Bucket {
    /// Tag of each slot (16 bits of the key's hash, never 0); 0 = free slot.
    tags: [u16; SLOTS],
    /// Record index `<< 1 | direction` (0 forward, 1 reply) of each slot.
    refs: [u32; SLOTS],
    /// Eviction hint of each slot: [`EVICTABLE`] plus the low 7 bits of the insertion second.
    meta: [u8; SLOTS],
    /// Entries whose home bucket lies before this one and that sit after it (saturates at 255,
    /// which then stays).
    overflow: u8,
    pad: [u8; 7],
}

/// Eviction hint bit: the flow was not established when this entry was written (checked against
/// the record before evicting).
const EVICTABLE: u8 = 0x80;

/// The slot of bucket `a` a full table evicts first: the oldest entry marked [`EVICTABLE`],
/// age counted in seconds modulo 128 from `now7`, the first of equals in slot order; `None`
/// when no entry is marked. With SSE2 the eight slots are compared at once;
/// `oldest_evictable_scalar`, the slot-by-slot loop, gives the same answer (a test compares
/// the two).
#[inline]
fn oldest_evictable(a: &Bucket, now7: u8) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        use safe_arch::{
            add_i8_m128i, bitand_m128i, bitandnot_m128i, byte_shr_imm_u128_m128i, cmp_eq_mask_i8_m128i,
            cmp_eq_mask_i16_m128i, cmp_lt_mask_i8_m128i, get_i32_from_m128i_s, m128i, max_u8_m128i, move_mask_i8_m128i,
            pack_i16_to_i8_m128i, set_splat_i8_m128i, sub_i8_m128i, zeroed_m128i,
        };
        let byte = |x: u8| set_splat_i8_m128i(i8::from_ne_bytes([x]));
        let zero = zeroed_m128i();
        // 0xff in each of the low eight bytes whose slot is free (tag 0): the 16-bit compares
        // packed; the high eight bytes hold no slot (their meta is zero: never marked).
        let free = pack_i16_to_i8_m128i(cmp_eq_mask_i16_m128i(m128i::from(a.tags), zero), zero);
        let meta = m128i::from(u128::from(u64::from_le_bytes(a.meta)));
        // EVICTABLE is the sign bit.
        let evictable = cmp_lt_mask_i8_m128i(meta, zero);
        // (now7 - stamp) mod 128, one more so that a marked entry of age 0 is not 0; no borrow
        // crosses bytes because 0x80 | now7 > stamp.
        let age = bitand_m128i(sub_i8_m128i(byte(now7 | 0x80), bitand_m128i(meta, byte(0x7f))), byte(0x7f));
        let key = bitandnot_m128i(free, bitand_m128i(evictable, add_i8_m128i(age, byte(1))));
        let mut top = max_u8_m128i(key, byte_shr_imm_u128_m128i::<4>(key));
        top = max_u8_m128i(top, byte_shr_imm_u128_m128i::<2>(top));
        top = max_u8_m128i(top, byte_shr_imm_u128_m128i::<1>(top));
        let top = get_i32_from_m128i_s(top).to_le_bytes()[0];
        if top == 0 {
            return None;
        }
        let at = move_mask_i8_m128i(cmp_eq_mask_i8_m128i(key, byte(top)));
        Some(at.trailing_zeros() as usize)
    }
    #[cfg(not(target_arch = "x86_64"))]
    oldest_evictable_scalar(a, now7)
}

/// [`oldest_evictable`] slot by slot.
#[cfg(any(test, not(target_arch = "x86_64")))]
fn oldest_evictable_scalar(a: &Bucket, now7: u8) -> Option<usize> {
    let mut best: Option<(usize, u8)> = None;
    for (i, (&t, &m)) in a.tags.iter().zip(&a.meta).enumerate() {
        if t == 0 || m & EVICTABLE == 0 {
            continue;
        }
        let old = now7.wrapping_sub(m) & 0x7f;
        if best.is_none_or(|(_, o)| old > o) {
            best = Some((i, old));
        }
    }
    best.map(|(i, _)| i)
}

/// Bitmask (bit `2 * slot`) of the slots whose tag equals `tag`.
#[inline]
fn match_tags(tags: &[u16; SLOTS], tag: u16) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use safe_arch::{cmp_eq_mask_i16_m128i, m128i, move_mask_i8_m128i, set_splat_i16_m128i};
        let eq = cmp_eq_mask_i16_m128i(m128i::from(*tags), set_splat_i16_m128i(i16::from_ne_bytes(tag.to_ne_bytes())));
        move_mask_i8_m128i(eq).cast_unsigned() & 0x5555
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut m = 0u32;
        for (i, t) in tags.iter().enumerate() {
            m |= u32::from(*t == tag) << (2 * i);
        }
        m
    }
}

/// The slot of the lowest set bit of a [`match_tags`] mask.
#[inline]
fn first_slot(m: u32) -> usize {
    (m.trailing_zeros() / 2) as usize
}

/// The tag of hash `h` in its bucket: its low 16 bits with the lowest set, so that no tag is
/// 0 (a free slot's). 15 bits tell entries apart: a lookup's false tag match, a record compared
/// for nothing, is 1 in 32,768 per occupied slot. (Replacing a zero tag by 1 instead, which
/// kept 1 in 65,535, cost three instructions per lookup where this costs one, callgrind,
/// docs/benchmarks.md.)
#[inline]
fn tag_of(h: u64) -> u16 {
    #[expect(clippy::cast_possible_truncation, reason = "the tag is the low 16 bits")]
    let t = h as u16;
    t | 1
}

/// The tables' random seeds: from the standard library's randomly keyed SipHash state (keys
/// drawn from the OS once per thread).
fn random_seeds() -> [u64; 5] {
    use core::hash::BuildHasher;
    let s = std::collections::hash_map::RandomState::new();
    core::array::from_fn(|i| s.hash_one(i) | 1)
}

/// Conntrack for one address family on one worker.
#[derive(Debug)]
pub struct Conntrack<A: CtFamily> {
    buckets: Region<Bucket>,
    recs: Region<Rec<A>>,
    nb: u64,
    seeds: [u64; 5],
    len: usize,
    capacity: usize,
    /// Records handed out at least once (`0..hw` are initialised).
    hw: u32,
    /// Freed records, a stack (the most recently freed, likely still cached, is reused first;
    /// the next ones can be prefetched without chasing links). A zeroed vector (`calloc`, so a
    /// large one is an anonymous mapping and only the depth it reaches costs memory until
    /// [`Conntrack::prefault`]), not a [`Region`]: borrowing a vector costs no checks, a
    /// region's borrow about 10 instructions, and a new flow borrowed it twice (the record's
    /// prefetch, the insert).
    free: Vec<u32>,
    nfree: usize,
    sweep_at: usize,
    /// What is left of the step [`Conntrack::sweep_begin`] started, for
    /// [`Conntrack::sweep_some`].
    pending: core::ops::Range<u32>,
    last_reclaim_s: u32,
    /// A 1,024-bit filter of the entries placed since [`Conntrack::mark`]: bit `hash >> 54`
    /// of each ([`placed_bit`]).
    placed: [u64; PLACED_WORDS],
}

/// Words of [`Conntrack::may_have_placed`]'s filter: 1,024 bits, so that the up to 128
/// entries a batch of 64 new flows places leave most of it clear (a 64-bit filter was
/// mostly set halfway through such a batch, and each set bit sends a new flow to a second
/// probe it does not need).
const PLACED_WORDS: usize = 16;

/// Word and bit of hash `h` in the placed filter: its top 10 bits.
#[inline]
fn placed_bit(h: u64) -> (usize, u64) {
    ((h >> 60) as usize, 1 << ((h >> 54) & 63))
}

/// Records hash `h` in the placed filter (a free function: `insert` holds the buckets and
/// records borrowed while it does).
#[inline]
fn note_placed(filter: &mut [u64; PLACED_WORDS], h: u64) {
    let (w, bit) = placed_bit(h);
    if let Some(x) = filter.get_mut(w) {
        *x |= bit;
    }
}

/// Whether hash `h`'s bit is set in the placed filter ([`Conntrack::may_have_placed`]).
#[inline]
fn was_placed(filter: &[u64; PLACED_WORDS], h: u64) -> bool {
    let (w, bit) = placed_bit(h);
    filter.get(w).is_some_and(|&x| x & bit != 0)
}

/// Number of buckets for `capacity` flows: two entries per flow at [`TARGET_LOAD`].
pub fn buckets_for(capacity: usize) -> usize {
    let slots = (capacity.max(1) as f64 * 2.0 / TARGET_LOAD).ceil();
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a positive count of slots")]
    let slots = slots as usize;
    slots.div_ceil(SLOTS).max(2)
}

impl<A: CtFamily> Conntrack<A> {
    /// A table for at most `capacity` flows (at most 2^31 − 1) with random hash seeds. The
    /// memory is reserved up front and committed as flows arrive (see the module docs).
    pub fn new(capacity: usize) -> Self {
        Self::with_seeds(capacity, random_seeds())
    }

    /// A table with the given hash seeds (tests and benchmarks that want repeatable layouts).
    pub fn with_seeds(capacity: usize, seeds: [u64; 5]) -> Self {
        let capacity = capacity.clamp(1, (u32::MAX >> 1) as usize);
        let nb = buckets_for(capacity);
        Self {
            buckets: Region::new(nb),
            recs: Region::new(capacity),
            nb: nb as u64,
            seeds,
            len: 0,
            capacity,
            hw: 0,
            free: vec![0; capacity],
            nfree: 0,
            sweep_at: 0,
            pending: 0..0,
            last_reclaim_s: u32::MAX,
            placed: [0; PLACED_WORDS],
        }
    }

    /// The record the `k`-th next insert will take, if no flow is removed or evicted first:
    /// the miss stage of a batch prefetches one per new flow ([`View::prefetch_record`]), so
    /// inserts find their record in cache. Past the table's capacity an id with no record,
    /// which [`View::prefetch_record`] ignores (not checked here: this runs once per new flow).
    #[inline]
    pub fn next_alloc(&self, k: usize) -> Option<RecId> {
        if k < self.nfree {
            self.free.get(self.nfree - 1 - k).copied()
        } else {
            u32::try_from(self.hw as usize + (k - self.nfree)).ok()
        }
    }

    /// Starts a new interval for [`Conntrack::may_have_placed`] (the batch pipeline calls it at
    /// the start of every batch).
    #[inline]
    pub fn mark(&mut self) {
        self.placed = [0; PLACED_WORDS];
    }

    /// Whether an entry with hash `h` may have been placed since [`Conntrack::mark`]: `false`
    /// means that a key that was absent at the mark is still absent (entries are only removed
    /// otherwise), so find-or-insert need not probe again.
    #[inline]
    pub fn may_have_placed(&self, h: u64) -> bool {
        was_placed(&self.placed, h)
    }

    /// Number of flows.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no flows.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maximum number of flows.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Commits the table's memory now (index, record slab, free list; see the module docs),
    /// keeping what is in it; returns the bytes committed. A worker calls this before it takes
    /// traffic, so that no page of the table is first touched by a packet.
    pub fn prefault(&mut self) -> usize {
        // The stack below its depth holds freed records (written, so committed); above it,
        // nothing yet.
        if let Some(unused) = self.free.get_mut(self.nfree..) {
            unused.fill(0);
        }
        self.buckets.prefault() + self.recs.prefault() + self.free.len() * core::mem::size_of::<u32>()
    }

    /// Bytes reserved: buckets plus the whole record slab (virtual memory).
    pub fn bytes_reserved(&self) -> usize {
        self.buckets.bytes() + self.recs.bytes()
    }

    /// Bytes of the index (buckets), all of which a busy table touches.
    pub fn bucket_bytes(&self) -> usize {
        self.buckets.bytes()
    }

    /// Bytes of the records handed out so far (the high-water mark of the slab).
    pub fn record_bytes_touched(&self) -> usize {
        self.hw as usize * core::mem::size_of::<Rec<A>>()
    }

    /// Whether the kernel accepted `MADV_HUGEPAGE` for both arrays.
    pub fn huge_pages_advised(&self) -> bool {
        self.buckets.huge_pages_advised() && self.recs.huge_pages_advised()
    }

    /// The keyed hash of `k`: computed once per packet and handed to the other calls.
    #[inline]
    pub fn hash(&self, k: &FlowKey<A>) -> u64 {
        A::hash_key(k, &self.seeds)
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        home_of(h, self.nb)
    }

    /// The table's arrays for the batch stages that only read: prefetch the home bucket
    /// (stage 1), compare its tags (stage 2).
    #[inline]
    pub fn view(&self) -> View<'_, A> {
        View { buckets: self.buckets.as_slice(), recs: self.recs.as_slice(), nb: self.nb, seeds: &self.seeds }
    }

    /// The entry for `k` (hash `h`), if any, whatever its expiry.
    #[inline]
    pub fn find(&self, k: &FlowKey<A>, h: u64) -> Option<Hit> {
        find_in(self.buckets.as_slice(), self.recs.as_slice(), self.home(h), self.nb as usize, k, h)
    }

    /// The live entry for `k` (hash `h`); an expired flow is removed, reported through
    /// `on_remove`, and `None` is returned.
    #[inline]
    pub fn lookup(&mut self, k: &FlowKey<A>, h: u64, now_s: u32, on_remove: impl FnOnce(Removed)) -> Option<Hit> {
        let hit = self.find(k, h)?;
        let r = self.recs.as_slice().get(hit.id as usize)?;
        if r.expires_s < now_s {
            if let Some(r) = self.remove(hit.id) {
                on_remove(r);
            }
            return None;
        }
        Some(hit)
    }

    /// Record `id` (any record below the capacity; check [`FlowRecord::in_use`]).
    #[inline]
    pub fn rec(&self, id: RecId) -> Option<&Rec<A>> {
        self.recs.as_slice().get(id as usize)
    }

    /// Record `id`, mutable. Changing its tuples or flags other than [`flow_flags::DEFERRED`]
    /// corrupts the index: only the state, expiry and rewrite fields may change in place.
    #[inline]
    pub fn rec_mut(&mut self, id: RecId) -> Option<&mut Rec<A>> {
        self.recs.as_mut_slice().get_mut(id as usize)
    }

    /// The table's arrays for a batch stage that finds entries and updates records in place.
    #[inline]
    pub fn view_mut(&mut self) -> ViewMut<'_, A> {
        ViewMut { buckets: self.buckets.as_mut_slice(), recs: self.recs.as_mut_slice(), nb: self.nb }
    }

    /// Whether no entry has key `k` (hash `h`): the SNAT port search asks this of candidate
    /// reply tuples.
    #[inline]
    pub fn is_free(&self, k: &FlowKey<A>, h: u64) -> bool {
        self.find(k, h).is_none()
    }

    /// Sets or clears the eviction hint of the entry at `hit` (called when a flow's state moves
    /// in or out of the evictable states).
    #[inline]
    pub fn set_evictable(&mut self, hit: &Hit, evictable: bool) {
        if let Some(b) = self.buckets.as_mut_slice().get_mut(hit.bucket as usize)
            && let Some(m) = b.meta.get_mut(usize::from(hit.slot))
        {
            *m = if evictable { *m | EVICTABLE } else { *m & !EVICTABLE };
        }
    }

    /// Inserts a new flow: record `rec` (which must be [`FlowRecord::in_use`]) with its forward
    /// entry under hash `fwd_hash` (the hash of `rec.fwd_key()`, from the lookup that missed) and,
    /// unless it is DSR or marked [`flow_flags::NO_REPLY`] (a flow handed over from another
    /// process whose reply entry another flow took there), its reply entry. The forward key
    /// must not be in the table. A reply entry of another flow with the same tuple is taken
    /// over if that flow is not live (not established, closing, or past its expiry:
    /// [`CtState::is_evictable`]; it gets [`flow_flags::NO_REPLY`]). Makes room if full
    /// (module docs); flows removed for it are reported through `on_remove`.
    ///
    /// # Errors
    /// [`InsertError::Full`] if no record could be freed, or (never seen at [`TARGET_LOAD`]) no
    /// bucket slot was free within [`MAX_PROBE`] buckets; [`InsertError::ReplyTupleInUse`] if
    /// another live flow has the same reply tuple (a flow evicted to make room stays evicted).
    #[inline]
    pub fn insert(
        &mut self,
        rec: Rec<A>,
        fwd_hash: u64,
        now_s: u32,
        on_remove: impl FnMut(Removed),
    ) -> Result<RecId, InsertError> {
        self.insert_hashed(&rec, fwd_hash, None, now_s, on_remove)
    }

    /// [`Conntrack::insert`] with the hash of `rec.reply_key()` already known (`reply_hash`;
    /// `None`: computed here): the batch's miss stage hashes a new flow's reply tuple to
    /// prefetch its bucket, and the insert then need not hash it again. A `reply_hash` that is
    /// not that key's hash files the reply entry where no lookup finds it. `rec` is borrowed and
    /// copied once, into its slot: the direct route rewrites the packet from the same record
    /// afterwards, so a record passed by value would be copied twice.
    ///
    /// # Errors
    /// As [`Conntrack::insert`].
    #[inline(always)]
    pub fn insert_hashed(
        &mut self,
        rec: &Rec<A>,
        fwd_hash: u64,
        reply_hash: Option<u64>,
        now_s: u32,
        on_remove: impl FnMut(Removed),
    ) -> Result<RecId, InsertError> {
        if self.len >= self.capacity {
            return self.insert_evicting(rec, fwd_hash, reply_hash, now_s, on_remove);
        }
        self.insert_room(rec, fwd_hash, reply_hash, now_s)
    }

    /// [`Conntrack::insert_hashed`] into a table with room. Out of line, as
    /// [`Conntrack::insert_evicting`] is: the caller's check of the length picks one of the two
    /// without a call in between.
    #[inline(never)]
    fn insert_room(
        &mut self,
        rec: &Rec<A>,
        fwd_hash: u64,
        reply_hash: Option<u64>,
        now_s: u32,
    ) -> Result<RecId, InsertError> {
        // The arrays are borrowed once for the whole insert (each borrow of a mapped region is
        // a few checks).
        self.inserter().insert_room(rec, fwd_hash, reply_hash, now_s)
    }

    /// The table borrowed for a run of inserts into it while it has room ([`Inserter`]).
    #[inline]
    pub fn inserter(&mut self) -> Inserter<'_, A> {
        let (bs, rs) = (self.buckets.as_mut_slice(), self.recs.as_mut_slice());
        let cap = rs.len();
        Inserter {
            bs,
            rs,
            fl: FreeList { stack: &mut self.free, n: &mut self.nfree, hw: &mut self.hw, cap },
            placed: &mut self.placed,
            len: &mut self.len,
            capacity: self.capacity,
            nb: self.nb,
            seeds: &self.seeds,
        }
    }

    /// [`Conntrack::insert_hashed`] into a full table: evicts first ([`evict_in`]), or reclaims
    /// ([`Conntrack::insert_after_reclaim`]). Out of line, so that an insert into a table with
    /// room carries none of it (docs/benchmarks.md, "Inserts into a full table").
    #[inline(never)]
    fn insert_evicting(
        &mut self,
        rec: &Rec<A>,
        fwd_hash: u64,
        reply_hash: Option<u64>,
        now_s: u32,
        mut on_remove: impl FnMut(Removed),
    ) -> Result<RecId, InsertError> {
        let (nb, seeds) = (self.nb, &self.seeds);
        // The arrays are borrowed once for the whole insert, eviction included (an insert that
        // evicted borrowing them per step made nine borrows).
        let (bs, rs) = (self.buckets.as_mut_slice(), self.recs.as_mut_slice());
        let mut fl = FreeList { stack: &mut self.free, n: &mut self.nfree, hw: &mut self.hw, cap: rs.len() };
        let Some(id) = evict_in(bs, rs, nb, seeds, fwd_hash, age(now_s), &mut on_remove) else {
            return self.insert_after_reclaim(rec, fwd_hash, reply_hash, now_s, on_remove);
        };
        // One flow out, one in, in the evicted flow's record: the length stays.
        insert_in(bs, rs, &mut fl, &mut self.placed, nb, seeds, rec, fwd_hash, reply_hash, now_s, id)
            .inspect_err(|_| self.len -= 1)
    }

    /// Removes flow `id` (both entries) and says what it was (its backend and state,
    /// `evicted: false`); `None`, nothing changed, if it holds no flow (free, or never handed
    /// out since the table was made or cleared). The record is read in place, not
    /// copied out (an eviction under a SYN flood removes a flow per new flow).
    pub fn remove(&mut self, id: RecId) -> Option<Removed> {
        let (bs, rs) = (self.buckets.as_mut_slice(), self.recs.as_mut_slice());
        let mut fl = FreeList { stack: &mut self.free, n: &mut self.nfree, hw: &mut self.hw, cap: rs.len() };
        let gone = remove_in(bs, rs, &mut fl, self.nb, &self.seeds, id)?;
        self.len -= 1;
        Some(gone)
    }

    /// Removes flow `id`'s reply entry and marks it [`flow_flags::NO_REPLY`] (its replies are no
    /// longer recognised): for a packet to a frontend whose client tuple is that entry's key.
    pub fn release_reply(&mut self, id: RecId) {
        let Some(rec) = self.recs.as_slice().get(id as usize).copied() else { return };
        if !rec.in_use() || !rec.has_reply() {
            return;
        }
        let rh = self.hash(&rec.reply_key());
        unplace(self.buckets.as_mut_slice(), self.nb, rh, id << 1 | 1);
        if let Some(r) = self.recs.as_mut_slice().get_mut(id as usize) {
            r.flags |= flow_flags::NO_REPLY;
        }
    }

    /// Expires one step's share of the records ([`SHARDS`] steps per pass over the records ever
    /// used) in one call: the rest of the step [`Conntrack::sweep_begin`] started if it is not
    /// done, else the next step. Returns the number of flows removed.
    pub fn sweep(&mut self, now_s: u32, on_remove: impl FnMut(Removed)) -> usize {
        self.sweep_begin();
        self.sweep_some(now_s, u32::MAX, on_remove)
    }

    /// Starts the next sweep step, to be done [`Conntrack::sweep_some`] at a time, unless the
    /// last one is not done yet (then the steps fall behind rather than any call doing more
    /// than its share).
    pub fn sweep_begin(&mut self) {
        if self.pending.is_empty() {
            self.pending = self.sweep_range();
        }
    }

    /// Visits at most `max` records of the step [`Conntrack::sweep_begin`] started and removes
    /// the expired ones; returns how many. The batch pipeline calls it once per batch, so that
    /// a step of a large table (16,384 records at 1,048,576 flows) costs no batch more than
    /// `max` records' work, even when every one of them has expired.
    pub fn sweep_some(&mut self, now_s: u32, max: u32, mut on_remove: impl FnMut(Removed)) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        let (start, end) = (self.pending.start, self.pending.end.min(self.hw));
        let stop = start.saturating_add(max).min(end);
        self.pending = stop..end;
        let mut removed = 0;
        for id in start..stop {
            let expired = self.recs.as_slice().get(id as usize).is_some_and(|r| r.in_use() && r.expires_s < now_s);
            if expired && let Some(r) = self.remove(id) {
                removed += 1;
                on_remove(r);
            }
        }
        removed
    }

    /// Records of the started step not visited yet.
    pub fn sweep_pending(&self) -> u32 {
        self.pending.end.min(self.hw).saturating_sub(self.pending.start)
    }

    /// The records the next sweep step visits; advances the step.
    fn sweep_range(&mut self) -> core::ops::Range<u32> {
        let i = self.sweep_at;
        self.sweep_at = (self.sweep_at + 1) % SHARDS;
        let chunk = self.hw.div_ceil(SHARDS as u32);
        let start = (i as u32).saturating_mul(chunk).min(self.hw);
        start..start.saturating_add(chunk).min(self.hw)
    }

    /// [`Conntrack::insert`] into a full table where nothing near the new flow could be evicted
    /// (see the module docs). It reclaims at most once per second: when the table is full of
    /// live established flows, each refused flow then costs one bucket probe, not a scan. The
    /// reclaim goes on with the sweep's current step, at most RECLAIM_BUDGET records of it, so
    /// that one insert never expires a whole step (16,384 records at 1,048,576 flows: 1.3 ms
    /// with every record expired and in cache).
    #[cold]
    fn insert_after_reclaim(
        &mut self,
        rec: &Rec<A>,
        fwd_hash: u64,
        reply_hash: Option<u64>,
        now_s: u32,
        mut on_remove: impl FnMut(Removed),
    ) -> Result<RecId, InsertError> {
        if self.last_reclaim_s != now_s {
            self.last_reclaim_s = now_s;
            self.sweep_begin();
            let start = self.pending.start;
            self.sweep_some(now_s, RECLAIM_BUDGET, &mut on_remove);
            if self.len >= self.capacity {
                self.early_drop(start..self.pending.start, &mut on_remove);
            }
        }
        if self.len >= self.capacity {
            return Err(InsertError::Full);
        }
        // Not full now, so this insert evicts nothing and does not come back here.
        self.insert_hashed(rec, fwd_hash, reply_hash, now_s, on_remove)
    }

    /// Evicts the not-established flows of `range` (the records the reclaim just swept).
    fn early_drop(&mut self, range: core::ops::Range<u32>, on_remove: &mut impl FnMut(Removed)) {
        for id in range.start..range.end.min(self.hw) {
            let evictable =
                self.recs.as_slice().get(id as usize).is_some_and(|r| r.in_use() && r.ct_state().is_evictable());
            if evictable && let Some(r) = self.remove(id) {
                on_remove(Removed { evicted: true, ..r });
            }
        }
    }

    /// Visits every flow (for `xlb conntrack` dumps; not for the packet path).
    pub fn for_each(&self, mut f: impl FnMut(RecId, &Rec<A>)) {
        for (id, r) in self.recs.as_slice().iter().take(self.hw as usize).enumerate() {
            if r.in_use() {
                f(id as RecId, r);
            }
        }
    }

    /// Removes every flow (tests, `xlb conntrack --flush`). Touches all of the index.
    pub fn clear(&mut self) {
        self.buckets.zero();
        let hw = self.hw as usize;
        if let Some(rs) = self.recs.as_mut_slice().get_mut(..hw) {
            rs.fill(Zeroable::zeroed());
        }
        self.hw = 0;
        self.nfree = 0;
        self.len = 0;
        self.pending = 0..0;
    }
}

/// Where a key's entry may be, from the tags of its home bucket: what the second stage of a
/// batch learns ([`View::probe`]) and the third uses ([`ViewMut::resolve`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Probe {
    /// Reference (`record << 1 | direction`) in the first slot whose tag matches, or
    /// [`Probe::NONE`].
    pub first: u32,
    /// The home bucket.
    pub bucket: u32,
    /// The slot of `first`.
    pub slot: u8,
    /// The key may also be elsewhere: more tags matched, or entries were displaced past the
    /// home bucket.
    pub more: bool,
}

impl Probe {
    /// `first` when no tag matched.
    pub const NONE: u32 = u32::MAX;
}

/// The arrays of one table, borrowed read-only for the first two stages of a batch.
#[derive(Debug)]
pub struct View<'a, A: CtFamily> {
    buckets: &'a [Bucket],
    recs: &'a [Rec<A>],
    nb: u64,
    seeds: &'a [u64; 5],
}

impl<A: CtFamily> View<'_, A> {
    /// As [`Conntrack::hash`].
    #[inline]
    pub fn hash(&self, k: &FlowKey<A>) -> u64 {
        A::hash_key(k, self.seeds)
    }

    /// Prefetches the home bucket of hash `h` (where a lookup almost always ends, where a new
    /// flow's insert into a full table almost always finds the flow it evicts, and where the
    /// miss stage expects a new flow's reply entry to go).
    #[inline]
    pub fn prefetch(&self, h: u64) {
        if let Some(b) = self.buckets.get(home_of(h, self.nb)) {
            prefetch(b);
        }
    }

    /// For a new flow of hash `h` that will need room (the table is full): `step` 0 prefetches
    /// the record of the flow [`Conntrack::insert`] would evict (the oldest evictable entry of
    /// the home bucket or, failing one there, of the next buckets, up to [`EVICT_REACH`]),
    /// `step` 1 (later, when that record has arrived) the bucket of its other entry, which the
    /// eviction must clear. The batch pipeline's stages 2 and 4 run both over its new flows so
    /// that a full table's evictions find what they touch in cache. Only hints: nothing
    /// changes. Returns the victim's entry (as [`View::prefetch_victim_other`] takes it), or
    /// [`Probe::NONE`] if there is none.
    #[inline]
    pub fn prefetch_victim(&self, h: u64, now_s: u32, step: u8) -> u32 {
        let Some((b, s)) = victim_in(self.buckets, self.nb, h, age(now_s)) else { return Probe::NONE };
        let Some(&r) = self.buckets.get(b).and_then(|bk| bk.refs.get(s)) else { return Probe::NONE };
        if step == 0 {
            if let Some(rec) = self.recs.get((r >> 1) as usize) {
                prefetch_rec(rec);
            }
        } else {
            self.prefetch_victim_other(r);
        }
        r
    }

    /// Step 1 of [`View::prefetch_victim`] for the victim entry step 0 returned (a hint:
    /// if the batch's earlier inserts changed the table since, only the prefetch is wasted).
    #[inline]
    pub fn prefetch_victim_other(&self, r: u32) {
        let Some(rec) = self.recs.get((r >> 1) as usize) else { return };
        if !rec.in_use() {
            return;
        }
        let other = match dir_of(r) {
            Dir::Forward if rec.has_reply() => rec.reply_key(),
            Dir::Forward => return,
            Dir::Reply => rec.fwd_key(),
        };
        self.prefetch(self.hash(&other));
    }

    /// Prefetches record `id` (out of range: nothing).
    #[inline]
    pub fn prefetch_record(&self, id: RecId) {
        if let Some(r) = self.recs.get(id as usize) {
            prefetch_rec(r);
        }
    }

    /// [`View::prefetch`], returning the home bucket of `h` for [`View::probe_at`].
    #[inline]
    pub fn prefetch_home(&self, h: u64) -> u32 {
        let bucket = home_of(h, self.nb);
        if let Some(b) = self.buckets.get(bucket) {
            prefetch(b);
        }
        #[expect(clippy::cast_possible_truncation, reason = "bucket < nb < 2^32")]
        let bucket = bucket as u32;
        bucket
    }

    /// Compares the tags of `h`'s home bucket and prefetches the record of the first match.
    #[inline]
    pub fn probe(&self, h: u64) -> Probe {
        #[expect(clippy::cast_possible_truncation, reason = "bucket < nb < 2^32")]
        self.probe_at(home_of(h, self.nb) as u32, h)
    }

    /// [`View::probe`] with `h`'s home bucket known ([`View::prefetch_home`] returned it):
    /// the batch's stage 1 computes it for its prefetch, and stage 2 need not again.
    #[inline]
    pub fn probe_at(&self, bucket: u32, h: u64) -> Probe {
        let Some(b) = self.buckets.get(bucket as usize) else {
            return Probe { first: Probe::NONE, bucket: 0, slot: 0, more: true };
        };
        let m = match_tags(&b.tags, tag_of(h));
        let slot = first_slot(m);
        let first = if m == 0 { Probe::NONE } else { b.refs.get(slot).copied().unwrap_or(Probe::NONE) };
        if let Some(r) = self.recs.get((first >> 1) as usize) {
            prefetch_rec(r);
        }
        #[expect(clippy::cast_possible_truncation, reason = "slot < 8")]
        Probe { first, bucket, slot: slot as u8, more: m & m.wrapping_sub(1) != 0 || b.overflow != 0 }
    }
}

/// A table borrowed for a run of inserts while it has room ([`Conntrack::inserter`]): its
/// arrays, free list, length and placed filter borrowed once for the run, where each
/// [`Conntrack::insert_hashed`] borrows the two mapped regions again (about 30 instructions
/// per insert, callgrind, docs/benchmarks.md, "The direct route's inserts through one borrow
/// of the table"). The batch pipeline's stage 5 holds one across consecutive new flows of the
/// direct routes. It neither evicts nor reclaims: when [`Inserter::has_room`] is false, the
/// insert goes through [`Conntrack::insert_hashed`].
pub struct Inserter<'a, A: CtFamily> {
    bs: &'a mut [Bucket],
    rs: &'a mut [Rec<A>],
    fl: FreeList<'a>,
    placed: &'a mut [u64; PLACED_WORDS],
    len: &'a mut usize,
    capacity: usize,
    nb: u64,
    seeds: &'a [u64; 5],
}

impl<A: CtFamily> core::fmt::Debug for Inserter<'_, A> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Inserter").field("len", &*self.len).field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl<A: CtFamily> Inserter<'_, A> {
    /// Whether the table holds fewer flows than its capacity, so that an insert needs no
    /// eviction.
    #[inline]
    pub fn has_room(&self) -> bool {
        *self.len < self.capacity
    }

    /// As [`Conntrack::hash`].
    #[inline]
    pub fn hash(&self, k: &FlowKey<A>) -> u64 {
        A::hash_key(k, self.seeds)
    }

    /// As [`Conntrack::may_have_placed`].
    #[inline]
    pub fn may_have_placed(&self, h: u64) -> bool {
        was_placed(self.placed, h)
    }

    /// As [`Conntrack::find`].
    #[inline]
    pub fn find(&self, k: &FlowKey<A>, h: u64) -> Option<Hit> {
        find_in(self.bs, self.rs, home_of(h, self.nb), self.nb as usize, k, h)
    }

    /// [`Conntrack::insert_hashed`] into a table with room ([`Inserter::has_room`]).
    ///
    /// # Errors
    /// As [`Conntrack::insert`]; [`InsertError::Full`] also when the table has no room (no
    /// free record: the records are as many as the capacity), where
    /// [`Conntrack::insert_hashed`] would evict.
    #[inline(always)]
    pub fn insert_room(
        &mut self,
        rec: &Rec<A>,
        fwd_hash: u64,
        reply_hash: Option<u64>,
        now_s: u32,
    ) -> Result<RecId, InsertError> {
        let id = self.fl.alloc().ok_or(InsertError::Full)?;
        let id = insert_in(
            self.bs,
            self.rs,
            &mut self.fl,
            self.placed,
            self.nb,
            self.seeds,
            rec,
            fwd_hash,
            reply_hash,
            now_s,
            id,
        )?;
        *self.len += 1;
        Ok(id)
    }
}

/// The arrays of one table, borrowed for a batch stage: finds entries and updates records in
/// place without going back through [`Conntrack`] for every packet.
#[derive(Debug)]
pub struct ViewMut<'a, A: CtFamily> {
    buckets: &'a mut [Bucket],
    recs: &'a mut [Rec<A>],
    nb: u64,
}

impl<A: CtFamily> ViewMut<'_, A> {
    /// As [`Conntrack::find`].
    #[inline]
    pub fn find(&self, k: &FlowKey<A>, h: u64) -> Option<Hit> {
        find_in(self.buckets, self.recs, home_of(h, self.nb), self.nb as usize, k, h)
    }

    /// The entry for `k` (hash `h`) and its record, using what [`View::probe`] found: the
    /// record of the first tag match is checked first (its key almost always matches), the rest
    /// of the probe only when the probe says the key may be elsewhere. Always inlined into the
    /// pipeline's stage 3 instances (a call measured 30 to 45 more instructions per packet).
    #[inline(always)]
    pub fn resolve(&mut self, k: &FlowKey<A>, h: u64, probe: &Probe) -> Option<(Hit, &mut Rec<A>)> {
        let id = probe.first >> 1;
        let dir = dir_of(probe.first);
        let first_matches = self.recs.get(id as usize).is_some_and(|r| A::key_is(r, dir, k));
        let hit = if first_matches {
            Hit { id, dir, bucket: probe.bucket, slot: probe.slot }
        } else if probe.more {
            self.find(k, h)?
        } else {
            return None;
        };
        let r = self.recs.get_mut(hit.id as usize)?;
        Some((hit, r))
    }

    /// Record `id`, mutable (same rules as [`Conntrack::rec_mut`]).
    #[inline]
    pub fn rec_mut(&mut self, id: RecId) -> Option<&mut Rec<A>> {
        self.recs.get_mut(id as usize)
    }

    /// As [`Conntrack::set_evictable`].
    #[inline]
    pub fn set_evictable(&mut self, hit: &Hit, evictable: bool) {
        if let Some(b) = self.buckets.get_mut(hit.bucket as usize)
            && let Some(m) = b.meta.get_mut(usize::from(hit.slot))
        {
            *m = if evictable { *m | EVICTABLE } else { *m & !EVICTABLE };
        }
    }
}

#[inline]
fn dir_of(r: u32) -> Dir {
    if r & 1 == 0 { Dir::Forward } else { Dir::Reply }
}

/// The home bucket of hash `h` among `nb`: multiply-shift range reduction (Lemire) of the
/// high 32 bits; `nb` < 2^32, so the product fits in u64.
#[inline]
fn home_of(h: u64, nb: u64) -> usize {
    ((h >> 32).wrapping_mul(nb) >> 32) as usize
}

/// The free records: a stack of freed ones over the never-used ones above the high-water
/// mark.
struct FreeList<'a> {
    stack: &'a mut [u32],
    n: &'a mut usize,
    hw: &'a mut u32,
    cap: usize,
}

impl FreeList<'_> {
    /// Takes a free record: the most recently freed one, else the next never-used one.
    #[inline]
    fn alloc(&mut self) -> Option<RecId> {
        if *self.n > 0 {
            *self.n -= 1;
            return self.stack.get(*self.n).copied();
        }
        if (*self.hw as usize) < self.cap {
            *self.hw += 1;
            return Some(*self.hw - 1);
        }
        None
    }

    /// Marks record `id` free and puts it on the stack.
    #[inline]
    fn free<A: CtFamily>(&mut self, rs: &mut [Rec<A>], id: RecId) {
        if let Some(r) = rs.get_mut(id as usize) {
            *r = Zeroable::zeroed();
            r.state = Rec::<A>::FREE;
        }
        if let Some(slot) = self.stack.get_mut(*self.n) {
            *slot = id;
            *self.n += 1;
        }
    }
}

/// Writes entry `r` for hash `h` into a free slot of its home bucket `home` if the tag of `h`
/// is in no bucket's probe from there (the home bucket holds no entry with that tag, and no
/// entry passed it), so that no entry for the key can exist: the common case of a new flow's
/// reply entry, done in one look at the bucket instead of a search ([`find_in`]) and then a
/// placement ([`place`]). `false`, nothing written, otherwise.
#[inline(always)]
fn place_if_absent(buckets: &mut [Bucket], home: usize, h: u64, r: u32, meta: u8) -> bool {
    let Some(bk) = buckets.get_mut(home) else { return false };
    if bk.overflow != 0 || match_tags(&bk.tags, tag_of(h)) != 0 {
        return false;
    }
    let free = match_tags(&bk.tags, 0);
    if free == 0 {
        return false;
    }
    fill_slot(bk, first_slot(free), h, r, meta);
    true
}

/// Writes entry `r` for hash `h` (its tag, the reference, `meta`) into slot `s` of `bk`.
#[inline(always)]
fn fill_slot(bk: &mut Bucket, s: usize, h: u64, r: u32, meta: u8) {
    if let (Some(t), Some(x), Some(m)) = (bk.tags.get_mut(s), bk.refs.get_mut(s), bk.meta.get_mut(s)) {
        *t = tag_of(h);
        *x = r;
        *m = meta;
    }
}

/// Writes entry `r` for hash `h` into the first free slot from its home bucket on, counting it
/// in the overflow of the buckets it passed. Returns `false` if none was free within
/// [`MAX_PROBE`] buckets. Always inlined: an insert places two entries, and as a call (the
/// compiler's choice with `#[inline]`) each cost about 14 more instructions of argument
/// moves, spills and return (callgrind, docs/benchmarks.md).
#[inline(always)]
fn place(buckets: &mut [Bucket], nb: u64, h: u64, r: u32, meta: u8) -> bool {
    let home = home_of(h, nb);
    let nb = nb as usize;
    let mut b = home;
    for step in 0..MAX_PROBE {
        let Some(bk) = buckets.get_mut(b) else { return false };
        let free = match_tags(&bk.tags, 0);
        if free != 0 {
            fill_slot(bk, first_slot(free), h, r, meta);
            let mut p = home;
            for _ in 0..step {
                if let Some(pb) = buckets.get_mut(p) {
                    pb.overflow = pb.overflow.saturating_add(1);
                }
                p = if p + 1 >= nb { 0 } else { p + 1 };
            }
            return true;
        }
        b = if b + 1 >= nb { 0 } else { b + 1 };
    }
    false
}

/// The body of [`Conntrack::insert_hashed`] over the table's arrays, into record `id` (taken
/// from the free list, or the record of the flow the insert evicted): files the reply entry
/// (or settles a clash with an older flow's entry) and the forward entry, notes both in the
/// placed filter, and writes the record; on failure frees `id`. The caller counts the flow
/// into the table's length.
#[expect(clippy::too_many_arguments, reason = "the table's arrays, borrowed once by insert")]
#[inline(always)]
fn insert_in<A: CtFamily>(
    bs: &mut [Bucket],
    rs: &mut [Rec<A>],
    fl: &mut FreeList<'_>,
    placed: &mut [u64; PLACED_WORDS],
    nb: u64,
    seeds: &[u64; 5],
    rec: &Rec<A>,
    fwd_hash: u64,
    reply_hash: Option<u64>,
    now_s: u32,
    id: RecId,
) -> Result<RecId, InsertError> {
    let meta = age(now_s) | if rec.ct_state().is_evictable() { EVICTABLE } else { 0 };
    // `NO_REPLY` comes only with a record handed over from another process (a new flow's
    // record has none): the flow's reply entry was another's there and stays so.
    let mut flags = rec.flags & !flow_flags::DEFERRED;
    if flags & (flow_flags::DSR | flow_flags::NO_REPLY) == 0 {
        let rk = rec.reply_key();
        let rh = reply_hash.unwrap_or_else(|| A::hash_key(&rk, seeds));
        let home = home_of(rh, nb);
        if place_if_absent(bs, home, rh, id << 1 | 1, meta) {
            note_placed(placed, rh);
        } else {
            match find_in(bs, rs, home, nb as usize, &rk, rh) {
                Some(Hit { id: other, dir: Dir::Reply, bucket, slot }) => {
                    // Same reply tuple as an older flow (the same client address and port reaching
                    // the same backend through another frontend). A live older flow keeps it and
                    // the newer one is refused, as Linux conntrack refuses the clash; an
                    // unassured or closing one (or one past its expiry) gives it up.
                    if rs.get(other as usize).is_some_and(|o| !o.ct_state().is_evictable() && o.expires_s >= now_s) {
                        fl.free(rs, id);
                        return Err(InsertError::ReplyTupleInUse);
                    }
                    if let Some(r) = bs.get_mut(bucket as usize).and_then(|b| b.refs.get_mut(usize::from(slot))) {
                        *r = id << 1 | 1;
                    }
                    if let Some(o) = rs.get_mut(other as usize) {
                        o.flags |= flow_flags::NO_REPLY;
                    }
                }
                // The tuple is another flow's forward key: that entry wins.
                Some(_) => flags |= flow_flags::NO_REPLY,
                None => {
                    if !place(bs, nb, rh, id << 1 | 1, meta) {
                        fl.free(rs, id);
                        return Err(InsertError::Full);
                    }
                    note_placed(placed, rh);
                }
            }
        }
    }
    note_placed(placed, fwd_hash);
    if !place(bs, nb, fwd_hash, id << 1, meta) {
        if flags & (flow_flags::DSR | flow_flags::NO_REPLY) == 0 {
            unplace(bs, nb, reply_hash.unwrap_or_else(|| A::hash_key(&rec.reply_key(), seeds)), id << 1 | 1);
        }
        fl.free(rs, id);
        return Err(InsertError::Full);
    }
    if let Some(slot) = rs.get_mut(id as usize) {
        // Copied whole, in 16-byte moves: `black_box` keeps the compiler from splitting the
        // caller's record into its fields where this is inlined (the direct route's record,
        // built on the stack, was then copied field by field, 41 instructions: a new flow
        // 1,112.7 -> 1,096.4 with the callgrind driver, docs/benchmarks.md). It changes
        // nothing but the code generated.
        *slot = *core::hint::black_box(rec);
        slot.flags = flags;
    }
    Ok(id)
}

/// The entry [`Conntrack::insert`] would evict for hash `h` (the oldest evictable entry of its
/// home bucket or, failing one there, of the next buckets, up to [`EVICT_REACH`]), over the
/// table's buckets, as (bucket, slot), in one loop: the tag stage's search for its
/// prefetch (in the split form of [`victim_for_insert`] there, a SYN into a full table cost 29
/// instructions more, callgrind, docs/benchmarks.md). A test holds the two to one answer.
#[inline]
fn victim_in(bs: &[Bucket], nb: u64, h: u64, now7: u8) -> Option<(usize, usize)> {
    victim_from(bs, nb, home_of(h, nb), EVICT_REACH, now7)
}

/// [`victim_in`] for an insert's eviction ([`evict_in`]): the home bucket inline, the buckets
/// after it out of line ([`victim_further`]). The home bucket holds an evictable entry in all
/// but about 1 in 150 cases at full capacity under a SYN flood ([`EVICT_REACH`]).
#[inline]
fn victim_for_insert(bs: &[Bucket], nb: u64, h: u64, now7: u8) -> Option<(usize, usize)> {
    let b = home_of(h, nb);
    victim_of(bs, b, now7).or_else(|| victim_further(bs, nb, next_bucket(b, nb), now7))
}

/// [`victim_in`] over the buckets after the home bucket, from bucket `b`.
#[cold]
#[inline(never)]
fn victim_further(bs: &[Bucket], nb: u64, b: usize, now7: u8) -> Option<(usize, usize)> {
    victim_from(bs, nb, b, EVICT_REACH - 1, now7)
}

/// The first victim ([`victim_of`]) among `n` buckets from bucket `b` on.
#[inline(always)]
fn victim_from(bs: &[Bucket], nb: u64, mut b: usize, n: usize, now7: u8) -> Option<(usize, usize)> {
    for _ in 0..n {
        if let Some(v) = victim_of(bs, b, now7) {
            return Some(v);
        }
        b = next_bucket(b, nb);
    }
    None
}

/// The oldest evictable entry of bucket `b` ([`oldest_evictable`]), as (bucket, slot).
#[inline(always)]
fn victim_of(bs: &[Bucket], b: usize, now7: u8) -> Option<(usize, usize)> {
    Some((b, oldest_evictable(bs.get(b)?, now7)?))
}

/// The bucket after `b` of a table of `nb` buckets (the last wraps to the first).
#[inline(always)]
fn next_bucket(b: usize, nb: u64) -> usize {
    if b + 1 >= nb as usize { 0 } else { b + 1 }
}

/// Evicts the oldest evictable flow with an entry in the home bucket of `h`, or failing one
/// there in the next ones, up to [`EVICT_REACH`] buckets ([`victim_in`]), and reports it
/// through `on_remove`. Returns the evicted flow's record, its entries cleared but the record
/// itself neither freed nor zeroed: the insert that evicted writes the new flow into it
/// ([`insert_in`]; it frees it if the insert fails), so an eviction does not push a record on
/// the free stack for the insert to pop. The caller counts the flow out of the table's length.
/// `None`: nothing evictable.
#[inline]
fn evict_in<A: CtFamily>(
    bs: &mut [Bucket],
    rs: &[Rec<A>],
    nb: u64,
    seeds: &[u64; 5],
    h: u64,
    now7: u8,
    on_remove: &mut impl FnMut(Removed),
) -> Option<RecId> {
    // A hint can be stale (the flow got established since): then it is cleared and the
    // next oldest is tried; bounded by the slots looked at.
    for _ in 0..SLOTS * EVICT_REACH {
        let (b, s) = victim_for_insert(bs, nb, h, now7)?;
        let r = bs.get(b).and_then(|bk| bk.refs.get(s)).copied()?;
        let id = r >> 1;
        let rec = rs.get(id as usize)?;
        if !(rec.in_use() && rec.ct_state().is_evictable()) {
            if let Some(m) = bs.get_mut(b).and_then(|bk| bk.meta.get_mut(s)) {
                *m &= !EVICTABLE;
            }
            continue;
        }
        // The entry found is cleared where it sits; the flow's other entry (if it has one) is
        // looked up. A reply entry always belongs to a flow that has one: a flow that lost
        // it (`NO_REPLY`) has no entry of that direction pointing at it.
        let fh = A::hash_key(&rec.fwd_key(), seeds);
        let (here, other) = if dir_of(r) == Dir::Forward {
            (fh, rec.has_reply().then(|| (A::hash_key(&rec.reply_key(), seeds), id << 1 | 1)))
        } else {
            (A::hash_key(&rec.reply_key(), seeds), Some((fh, id << 1)))
        };
        on_remove(Removed { backend: rec.backend, state: rec.ct_state(), evicted: true });
        clear_at(bs, nb, here, b, s);
        if let Some((oh, or)) = other {
            unplace(bs, nb, oh, or);
        }
        return Some(id);
    }
    None
}

/// Clears the entry in slot `s` of bucket `b`, whose hash is `h`, and the overflow counts it
/// added on its way from its home bucket: what [`unplace`] does once it found the entry.
#[inline(always)]
fn clear_at(buckets: &mut [Bucket], nb: u64, h: u64, b: usize, s: usize) {
    if let Some(bk) = buckets.get_mut(b)
        && let (Some(t), Some(x), Some(m)) = (bk.tags.get_mut(s), bk.refs.get_mut(s), bk.meta.get_mut(s))
    {
        *t = 0;
        *x = 0;
        *m = 0;
    }
    let mut p = home_of(h, nb);
    for _ in 0..MAX_PROBE {
        if p == b {
            return;
        }
        if let Some(pb) = buckets.get_mut(p)
            && pb.overflow != u8::MAX
        {
            pb.overflow = pb.overflow.saturating_sub(1);
        }
        p = next_bucket(p, nb);
    }
}

/// Removes flow `id` (both entries) over the table's arrays, as [`Conntrack::remove`] (which
/// also counts it out of the table's length). `None`, nothing changed, for a record that holds
/// no flow: a free one, or one at or above the high-water mark, never handed out since the
/// table was made or cleared (its memory is zero, which [`FlowRecord::in_use`] alone would
/// take for a flow in state 0).
#[inline]
fn remove_in<A: CtFamily>(
    bs: &mut [Bucket],
    rs: &mut [Rec<A>],
    fl: &mut FreeList<'_>,
    nb: u64,
    seeds: &[u64; 5],
    id: RecId,
) -> Option<Removed> {
    if id >= *fl.hw {
        return None;
    }
    let rec = rs.get(id as usize)?;
    if !rec.in_use() {
        return None;
    }
    let gone = Removed { backend: rec.backend, state: rec.ct_state(), evicted: false };
    let fh = A::hash_key(&rec.fwd_key(), seeds);
    let rh = rec.has_reply().then(|| A::hash_key(&rec.reply_key(), seeds));
    unplace(bs, nb, fh, id << 1);
    if let Some(rh) = rh {
        unplace(bs, nb, rh, id << 1 | 1);
    }
    fl.free(rs, id);
    Some(gone)
}

/// Clears entry `r` (hash `h`) and the overflow counts it added. Returns whether it was found.
#[inline]
fn unplace(buckets: &mut [Bucket], nb: u64, h: u64, r: u32) -> bool {
    let home = home_of(h, nb);
    let nb = nb as usize;
    let tag = tag_of(h);
    let mut b = home;
    for step in 0..MAX_PROBE {
        let Some(bk) = buckets.get_mut(b) else { return false };
        let mut m = match_tags(&bk.tags, tag);
        while m != 0 {
            let s = first_slot(m);
            m &= m - 1;
            if bk.refs.get(s) == Some(&r) {
                if let (Some(t), Some(x), Some(mm)) = (bk.tags.get_mut(s), bk.refs.get_mut(s), bk.meta.get_mut(s)) {
                    *t = 0;
                    *x = 0;
                    *mm = 0;
                }
                let mut p = home;
                for _ in 0..step {
                    if let Some(pb) = buckets.get_mut(p)
                        && pb.overflow != u8::MAX
                    {
                        pb.overflow = pb.overflow.saturating_sub(1);
                    }
                    p = if p + 1 >= nb { 0 } else { p + 1 };
                }
                return true;
            }
        }
        if bk.overflow == 0 {
            return false;
        }
        b = if b + 1 >= nb { 0 } else { b + 1 };
    }
    false
}

#[inline]
fn find_in<A: CtFamily>(
    buckets: &[Bucket],
    recs: &[Rec<A>],
    home: usize,
    nb: usize,
    k: &FlowKey<A>,
    h: u64,
) -> Option<Hit> {
    let tag = tag_of(h);
    let mut b = home;
    for _ in 0..MAX_PROBE {
        let bk = buckets.get(b)?;
        let mut m = match_tags(&bk.tags, tag);
        while m != 0 {
            let s = first_slot(m);
            m &= m - 1;
            let r = *bk.refs.get(s)?;
            let dir = dir_of(r);
            if let Some(rec) = recs.get((r >> 1) as usize)
                && A::key_is(rec, dir, k)
            {
                #[expect(clippy::cast_possible_truncation, reason = "bucket < 2^32, slot < 8")]
                return Some(Hit { id: r >> 1, dir, bucket: b as u32, slot: s as u8 });
            }
        }
        if bk.overflow == 0 {
            return None;
        }
        b = if b + 1 >= nb { 0 } else { b + 1 };
    }
    None
}

/// The 7-bit age stamp of second `now_s`.
#[inline]
fn age(now_s: u32) -> u8 {
    (now_s & 0x7f) as u8
}

/// Conntrack timeouts in seconds (seed CT-04; IPVS defaults).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Timeouts {
    /// Handshake in progress (IPVS `SYN_RECV` 60 s).
    pub tcp_syn_s: u32,
    /// Established TCP (`tcpTimeout`, 900 s).
    pub tcp_established_s: u32,
    /// After a FIN (`tcpFinTimeout`, 120 s).
    pub tcp_fin_s: u32,
    /// After a RST (IPVS `CLOSE` 10 s).
    pub tcp_close_s: u32,
    /// UDP and SCTP (`udpTimeout`, 300 s).
    pub udp_s: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { tcp_syn_s: 60, tcp_established_s: 900, tcp_fin_s: 120, tcp_close_s: 10, udp_s: 300 }
    }
}

impl Timeouts {
    /// Timeout for a state, in seconds.
    #[inline]
    pub fn for_state(&self, s: CtState) -> u32 {
        match s {
            CtState::Datagram => self.udp_s,
            CtState::SynSent => self.tcp_syn_s,
            CtState::Established => self.tcp_established_s,
            CtState::FinWait => self.tcp_fin_s,
            CtState::Closed => self.tcp_close_s,
        }
    }

    /// Timeouts indexed by state number (for the per-packet path).
    pub fn by_state(&self) -> [u32; 5] {
        CtState::ALL.map(|s| self.for_state(s))
    }
}

/// Next TCP state after a packet with `flags` (either direction).
///
/// Liberal on purpose (seed CT-06: never reset a flow for an out-of-window packet): only
/// SYN, FIN and RST move the state; an ACK without SYN finishes a handshake. The backend's
/// SYN-ACK does not: a flow stays [`CtState::SynSent`] (evictable, the short timeout) until
/// the client's ACK, as IPVS's SYN_RECV and Linux conntrack's unassured SYN_RECV do, so that
/// a flood of spoofed SYNs that a live backend answers cannot fill the table with flows no
/// eviction may take.
#[inline]
pub const fn tcp_next(state: CtState, flags: u8) -> CtState {
    if flags & tcp_flags::RST != 0 {
        return CtState::Closed;
    }
    if flags & tcp_flags::FIN != 0 {
        return CtState::FinWait;
    }
    match state {
        CtState::SynSent | CtState::Datagram if flags & (tcp_flags::ACK | tcp_flags::SYN) == tcp_flags::ACK => {
            CtState::Established
        }
        s => s,
    }
}

/// Bytes of one record of family `A` (64 for IPv4, 128 for IPv6).
pub const fn record_bytes<A: CtFamily>() -> usize {
    core::mem::size_of::<Rec<A>>()
}

/// Bytes of index one entry takes at [`TARGET_LOAD`] (a 64-byte bucket holds 8).
pub const fn entry_bytes() -> usize {
    core::mem::size_of::<Bucket>() / SLOTS
}

#[cfg(test)]
mod tests;
